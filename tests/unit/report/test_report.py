"""`evaluate report`: the HTML page rendered by a real headless browser (Debian's chromium), and its PNG charts."""

from __future__ import annotations

import html
import json
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from tests.support.browser import CHROMIUM, dump_dom, needs_browser
from tests.support.comparisons import record_invocation, sample_rows
from tests.support.lm_eval_runs import gsm8k_run, humaneval_run, record_run

runner = CliRunner(env={"COLUMNS": "200"})
BLUE, ORANGE = (0x00, 0x72, 0xB2), (0xE6, 0x9F, 0x00)  # the first two series' colours


@pytest.fixture
def report(tmp_path: Path) -> Path:
    base = [1.0] * 140 + [0.0] * 60  # 0.7000
    worse = [0.0] * 40 + [1.0] * 100 + [0.0] * 60  # 0.5000: 40 right answers lost
    record_invocation(
        tmp_path / "jobs", "aaaa0001", {"mmlu": sample_rows("mmlu", {"exact_match": base})}, label="step-1000"
    )
    record_invocation(
        tmp_path / "jobs", "bbbb0002", {"mmlu": sample_rows("mmlu", {"exact_match": worse})}, label="step-2000"
    )
    out = tmp_path / "out" / "report.html"
    result = runner.invoke(app, ["report", "aaaa0001", "bbbb0002", "-o", str(out), "--png", str(tmp_path / "png")])
    assert result.exit_code == 0, result.output
    return out


class _Text(HTMLParser):
    """The visible text of a page, and the external resources it would load."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.loads: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._skip += tag in ("style", "script")
        self.loads += [v or "" for k, v in attrs if k in ("src", "href") or (tag == "link")]

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("style", "script")

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.text.append(data.strip())


def test_the_page_is_self_contained(report: Path):
    page = _Text()
    page.feed(report.read_text())
    assert page.loads == []  # no script, stylesheet, image or font to fetch
    assert "<script" not in report.read_text()


@needs_browser
def test_the_browser_shows_the_numbers_charts_and_verdict(report: Path, tmp_path: Path):
    dom = dump_dom(report.as_uri())
    page = _Text()
    page.feed(dom)
    text = " | ".join(page.text)
    # the score table: values, stderr (sd / sqrt(n)), the 95 % interval and n
    se_a = (0.7 * 0.3 * 200 / 199) ** 0.5 / 200**0.5
    assert "0.7000" in text and "0.5000" in text
    assert f"{se_a:.4f}" in text
    assert f"[{0.7 - 1.959964 * se_a:.4f}, {0.7 + 1.959964 * se_a:.4f}]" in text
    assert "step-1000 (aaaa0001)" in text and "step-2000 (bbbb0002)" in text
    # the chart: one SVG per task, a bar per invocation
    assert dom.count("<svg") == 1
    assert "step-1000 (aaaa0001): exact_match = 0.7000" in dom and "step-2000 (bbbb0002): exact_match = 0.5000" in dom
    assert len(re.findall(r"<rect[^>]*fill=\"#0072B2\"", dom)) == 2  # a bar and its legend swatch
    # the comparison: 40 discordant pairs all one way, exact McNemar p = 2 / 2**40
    assert "-0.2000" in text and "exact McNemar" in text and "worse" in text
    assert f"{2 / 2**40:.2g}" in text
    assert "Holm" in text


@needs_browser
def test_a_screenshot_shows_both_series(report: Path, tmp_path: Path):
    from PIL import Image

    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=1200,1400",
            report.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    colours = {c for _, c in Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)}
    assert BLUE in colours and ORANGE in colours


# measures the laid-out page in the browser (added to a copy of the report: the report itself has no script)
MEASURE = """<script>
window.addEventListener("load", () => {
  const boxes = [...document.querySelectorAll("table")].map((t) => {
    const box = t.parentElement.getBoundingClientRect();
    return {id: t.id, table: t.getBoundingClientRect().width, box_width: box.width, box_right: box.right};
  });
  const page = {inner: window.innerWidth, scroll: document.documentElement.scrollWidth, boxes: boxes};
  document.body.setAttribute("data-layout", JSON.stringify(page));
});
</script>"""


def _layout(page: Path, width: int) -> dict[str, Any]:
    measured = page.with_name("measured.html")
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    dom = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--window-size={width},900",
            "--dump-dom",
            measured.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    found = re.search(r'data-layout="([^"]*)"', dom)
    assert found, dom[-2000:]
    return dict(json.loads(html.unescape(found.group(1))))


@needs_browser
def test_the_tables_fit_a_1200_pixel_window(tmp_path: Path):
    # long labels and HumanEval's long metric name: the comparison table once ran 220 px past the window and
    # cut its verdict column off
    code, mmlu = "adlr_humaneval_greedy", "adlr_mmlu_pro_5_shot_base"
    for inv, lost, label in (("aaaa0001", 0, "step-1000-of-a-long-training-run"), ("bbbb0002", 40, "step-2000-x")):
        scores = [0.0] * lost + [1.0] * (140 - lost) + [0.0] * 60
        tasks = {
            code: sample_rows(code, {"pass_at_1__n=1__evalplus_sanitize": scores}),
            mmlu: sample_rows(mmlu, {"exact_match__custom-extract": scores}),
        }
        record_invocation(tmp_path / "jobs", inv, tasks, label=label)
    out = tmp_path / "wide.html"
    result = runner.invoke(app, ["report", "aaaa0001", "bbbb0002", "-o", str(out)])
    assert result.exit_code == 0, result.output
    layout = _layout(out, 1200)
    assert layout["inner"] == 1200
    assert layout["scroll"] <= layout["inner"]  # the page never scrolls sideways
    boxes = {b["id"]: b for b in layout["boxes"]}
    assert {"invocations", "scores", "comparison"} <= set(boxes)
    for box in boxes.values():
        assert box["box_right"] <= layout["inner"], box
    # the comparison fits whole, its verdict column included (no scrolling needed to read it)
    assert boxes["comparison"]["table"] <= boxes["comparison"]["box_width"], boxes["comparison"]


@pytest.fixture
def runs_with_answers(tmp_path: Path) -> Path:
    """Two invocations laid out as real runs leave them (lm-eval's samples collected into samples.jsonl)."""
    base, cand = [i < 8 for i in range(12)], [i < 5 or i == 10 for i in range(12)]
    record_run(
        tmp_path / "jobs",
        "aaaa0001",
        {"gsm8k": lambda d: gsm8k_run(d / "output", base), "adlr_humaneval_greedy": humaneval_run},
    )
    record_run(
        tmp_path / "jobs",
        "bbbb0002",
        {
            "gsm8k": lambda d: gsm8k_run(d / "output", cand),
            "adlr_humaneval_greedy": lambda d: humaneval_run(d, {0: False, 1: True}),
        },
    )
    out = tmp_path / "flips.html"
    result = runner.invoke(app, ["report", "aaaa0001", "bbbb0002", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


class _Rows(HTMLParser):
    """The cells of each table, by table id (a cell's text joined)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table = ""
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._table = dict(attrs).get("id") or ""
            self.tables[self._table] = []
        elif tag == "tr":
            self.tables[self._table].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


@needs_browser
def test_the_per_sample_changes_show_both_answers_side_by_side(runs_with_answers: Path):
    page = _Text()
    page.feed(runs_with_answers.read_text())
    assert page.loads == []  # still one self-contained file
    dom = dump_dom(runs_with_answers.as_uri())
    shown = _Text()
    shown.feed(dom)
    text = " | ".join(shown.text)
    assert "Per-sample changes" in text
    assert "on exact_match__strict-match: | 3 right → wrong | , | 1 wrong → right" in text
    assert "4 changed of 12 documents both scored" in text
    tables = _Rows()
    tables.feed(dom)
    gsm8k = tables.tables["flips-gsm8k-bbbb0002"]
    assert gsm8k[0] == ["document", "prompt", "aaaa0001 answered", "bbbb0002 answered", "target", "score"]
    # worst first; the prompt collapsed (its summary, then the whole prompt inside <details>)
    assert [r[0] for r in gsm8k[1:]] == ["gsm8k/5", "gsm8k/6", "gsm8k/7", "gsm8k/10"]
    first = gsm8k[1]
    assert first[1].startswith("Question: Question 5: how many apples? Answer:")
    assert first[2:] == ["7", "8", "Some reasoning.\n#### 7", "1 → 0"]
    assert gsm8k[4][5] == "0 → 1"
    assert dom.count("<details>") == 4 + 2  # one per flipped document (gsm8k 4, HumanEval 2)
    # HumanEval: the code each one wrote, side by side
    code = tables.tables["flips-adlr_humaneval_greedy-bbbb0002"]
    assert [r[0] for r in code[1:]] == ["adlr_humaneval_greedy/0", "adlr_humaneval_greedy/1"]
    assert "def has_close_elements" in code[1][2] and code[1][5] == "1 → 0"
    layout = _layout(runs_with_answers, 1200)
    assert layout["scroll"] <= layout["inner"]
    assert all(b["box_right"] <= layout["inner"] for b in layout["boxes"])


def test_png_charts(report: Path, tmp_path: Path):
    from PIL import Image

    image = Image.open(tmp_path / "png" / "mmlu.png").convert("RGB")
    assert image.width > 300 and image.height > 200
    colours = {c for _, c in image.getcolors(maxcolors=1 << 20)}
    assert BLUE in colours and ORANGE in colours


def test_report_of_an_unknown_invocation_is_one_message(tmp_path: Path):
    result = runner.invoke(app, ["report", "ffff0000", "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and "No invocation 'ffff0000'" in result.output
    assert not (tmp_path / "r.html").exists()


def _watched_run() -> None:
    """A watch run with three evaluated checkpoints and one that failed (recorded as `evaluate watch` does)."""
    from ckpteval.watch.state import IterationEntry, WatchSpec, WatchState

    spec = WatchSpec(save_dir="/s", configs=["tiny"], profile=None, tasks=["hellaswag"], overrides=[])
    state = WatchState(run="run42-abcdef", spec=spec, created=0.0)
    for i, acc in ((100, 0.25), (200, 0.3125), (300, 0.4375)):
        metrics = {"hellaswag/acc": acc, "hellaswag/acc_stderr": 0.02, "hellaswag/n_samples": 50.0}
        state.iterations[i] = IterationEntry(i, f"/s/iter_{i:07d}", "succeeded", 0.0, metrics=metrics)
    state.iterations[400] = IterationEntry(400, "/s/iter_0000400", "failed", 0.0, note="3 attempts failed")
    row = {"task": "hellaswag", "metric": "acc", "against": 200, "delta": 0.125, "ci_low": 0.02, "ci_high": 0.23}
    row |= {"mde": 0.09, "n": 50, "verdict": "better", "tested": True, "note": "", "p_adjusted": 0.01}
    state.iterations[300].verdicts = {"previous": [row]}
    state.save()


@needs_browser
def test_a_watched_run_shows_its_scores_against_iteration(tmp_path: Path):
    _watched_run()
    out = tmp_path / "watch.html"
    result = runner.invoke(app, ["report", "--watch", "run42", "-o", str(out), "--png", str(tmp_path / "png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "png" / "watch-run42-abcdef.png").stat().st_size > 1000
    page = _Text()
    page.feed(out.read_text())
    assert page.loads == []
    dom = dump_dom(out.as_uri())
    shown = _Text()
    shown.feed(dom)
    text = " | ".join(shown.text)
    assert "Scores against iteration" in text and "hellaswag/acc — watch run run42-abcdef" in text
    # one point per evaluated iteration, in order, with its value; the failed iteration has none
    for i, acc in ((100, 0.25), (200, 0.3125), (300, 0.4375)):
        assert f"iteration {i}: hellaswag/acc = {acc:.4f} ± 0.0200" in dom
    assert "iteration 400:" not in dom
    values = re.findall(r'class="value">([0-9.]+)<', dom)
    assert values == ["0.250", "0.312", "0.438"]
    assert dom.count("<polygon") == 1  # the ± 1 stderr band
    # the verdict of 300 against 200 (evaluate watch's paired test), as a row of its own table
    assert "Is each checkpoint better?" in text
    assert "300 | previous | hellaswag | acc | 200 | +0.1250 | [+0.0200, +0.2300] | 0.0900 | better" in text


def test_report_needs_an_invocation_or_a_watch_run(tmp_path: Path):
    result = runner.invoke(app, ["report", "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2
    assert "Name the invocation(s) or watch run(s)" in result.output
    assert not (tmp_path / "r.html").exists()


@needs_browser
def test_the_report_shows_every_warning_compare_prints(tmp_path: Path):
    """Runs whose request settings differ (limit_samples 1 vs 2), one of them without a verified endpoint: the
    page shows, word for word, each `caveat:` and `warning:` line that `evaluate compare` prints."""
    rows = {"mmlu": sample_rows("mmlu", {"exact_match": [1.0, 0.0] * 50})}
    served = {"kind": "megatron/builtin", "identity": "ckpteval-1"}
    record_invocation(tmp_path, "aaaa0001", rows, settings={"mmlu": {"limit_samples": 1}}, served=served)
    record_invocation(tmp_path, "bbbb0002", rows, settings={"mmlu": {"limit_samples": 2}}, served={"kind": "none"})
    compared = CliRunner(env={"COLUMNS": "1000"}).invoke(app, ["compare", "aaaa0001", "bbbb0002"])
    assert compared.exit_code == 0, compared.output
    printed = [line for line in compared.output.splitlines() if line.startswith(("caveat: ", "warning: "))]
    assert any("request settings differ (limit_samples: 1 vs 2)" in line for line in printed), printed
    assert any(line.startswith("caveat: bbbb0002: endpoint not verified") for line in printed), printed
    assert len(printed) >= 4  # + the endpoint's identity and the deployment kind differ

    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", "aaaa0001", "bbbb0002", "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = _Text()
    page.feed(dump_dom(out.as_uri()))
    for line in printed:
        assert line in page.text, line  # each its own line on the page, as compare prints it
    # and each run's own caveats under the score table
    assert any(t.startswith("⚠ bbbb0002: endpoint not verified") for t in page.text), page.text
