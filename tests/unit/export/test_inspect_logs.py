"""`evaluate export ID --to inspect`: Inspect evaluation logs of a recorded invocation (harness output in lm-eval's
real format; HumanEval a recorded run), read back with inspect-ai's own reader and opened in `inspect view` in
Debian's headless chromium."""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.results.model import InvocationResults
from ckpteval.results.samples import read_samples
from tests.deploy_support import free_port
from tests.support.browser import CHROMIUM, needs_browser
from tests.support.lm_eval_runs import gsm8k_run, hellaswag_run, humaneval_run, record_run, repeated_gsm8k_run
from tests.support.waiting import answers, wait_until

runner = CliRunner(env={"COLUMNS": "200"})
# not installed: skipped; installed but broken: the tests fail (CI installs it: uv sync --extra inspect)
needs_inspect = pytest.mark.skipif(
    importlib.util.find_spec("inspect_ai") is None, reason="needs the inspect extra: uv sync --extra inspect"
)
# the tasks we ship, by kind: multiple choice by log-likelihood, generation with two answer filters,
# code (a recorded HumanEval run), and repeated sampling (3 repeats: the epochs of each document)
TASKS = {
    "hellaswag": lambda d: hellaswag_run(d, [i < 7 for i in range(10)]),
    "gsm8k": lambda d: gsm8k_run(d / "output", [i < 5 for i in range(8)]),
    "adlr_humaneval_greedy": humaneval_run,
    "gsm8k_x3": lambda d: repeated_gsm8k_run(d, [[i < k for i in range(6)] for k in (2, 3, 4)]),
}


@needs_inspect
def test_every_task_round_trips_through_inspects_reader(tmp_path: Path):
    from inspect_ai.log import read_eval_log

    record_run(tmp_path / "jobs", "aaaa0001", TASKS)
    result = runner.invoke(app, ["export", "aaaa", "--to", "inspect", "--out", str(tmp_path / "logs")])
    assert result.exit_code == 0, result.output
    *written, last = result.output.strip().splitlines()
    assert last == f"Open them with: inspect view --log-dir {tmp_path / 'logs'}"
    logs = dict(line.split(": ", 1) for line in written)  # task -> its log
    assert sorted(logs) == sorted(TASKS)
    assert sorted(logs.values()) == sorted(str(p) for p in (tmp_path / "logs").glob("*.eval"))
    job = tmp_path / "jobs" / "aaaa0001"
    ours = InvocationResults.from_json(json.loads((job / "results.json").read_text()))
    for task, outcome in ours.tasks.items():
        log = read_eval_log(logs[task])
        assert (log.status, log.eval.task, log.eval.run_id) == ("success", task, "aaaa0001")
        rows = read_samples(job / "tasks" / task / "samples.jsonl")
        assert log.samples is not None and len(log.samples) == len(rows)
        repeats = sorted({r.repeat for r in rows if r.repeat is not None})
        assert log.eval.config.epochs == max(len(repeats), 1)
        for sample, row in zip(log.samples, rows, strict=True):
            assert (sample.id, sample.input, sample.target) == (row.sample, row.prompt, row.target)
            assert row.prompt and row.target and row.response  # the harness logged them: compared, not ""
            assert sample.output.completion == row.response
            assert sample.epoch == (repeats.index(row.repeat) + 1 if row.repeat is not None else 1)
            assert {m: s.value for m, s in (sample.scores or {}).items()} == row.scores
            answer = row.answer if row.answer is not None else row.response
            assert {s.answer for s in (sample.scores or {}).values()} == {answer}
        # the aggregate: each metric of results.json in each evaluation mode, with its standard error
        assert log.results is not None and log.results.completed_samples == len({r.sample for r in rows})
        scores = {s.name: s.metrics for s in log.results.scores}
        assert set(scores) == set(outcome.metrics)
        for metric, aggregate in outcome.metrics.items():
            for mode, values in outcome.evaluation_modes().items():
                assert scores[metric][mode].value == values[metric].value
            assert scores[metric]["stderr"].value == aggregate.stderr
    # the kinds are all there: a code answer, a repeated task's epochs
    humaneval = read_eval_log(logs["adlr_humaneval_greedy"])
    assert "for idx, elem in enumerate(numbers):" in (humaneval.samples or [])[0].output.completion
    assert set(ours.tasks["gsm8k_x3"].modes) == {"pass@1[avg-of-3]", "majority@3", "pass@3"}


@needs_inspect
def test_exporting_again_replaces_the_logs(tmp_path: Path):
    record_run(tmp_path / "jobs", "aaaa0001", {"gsm8k": TASKS["gsm8k"]})
    out = tmp_path / "logs"
    for _ in range(2):
        result = runner.invoke(app, ["export", "aaaa0001", "--to", "inspect", "-o", str(out)])
        assert result.exit_code == 0, result.output
    assert [p.name for p in out.iterdir()] == ["2026-11-27T10-00-00Z_gsm8k_aaaa0001.eval"]


def test_without_inspect_ai_one_line_says_how_to_install_it(tmp_path: Path):
    # inspect_ai made unimportable in a fresh interpreter, as in an environment without the extra
    code = (
        "import sys; sys.modules['inspect_ai'] = None\n"
        "from ckpteval.cli.main import main\n"
        "main(['export', 'aaaa0001', '--to', 'inspect'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"}
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: Exporting to Inspect needs inspect-ai, not installed here: "
        "uv sync --extra inspect (or pip install 'ckpteval[inspect]')."
    ]
    assert not (Path.cwd() / "logs").exists()


@needs_inspect
def test_an_unknown_invocation_is_one_message(tmp_path: Path):
    result = runner.invoke(app, ["export", "ffff0000", "--to", "inspect", "-o", str(tmp_path / "logs")])
    assert result.exit_code == 2 and "No invocation 'ffff0000'" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "logs").exists()


def test_out_without_inspect_is_refused(tmp_path: Path):
    result = runner.invoke(app, ["export", "aaaa0001", "--to", "wandb", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--out is where Inspect logs go" in result.output


# -- `inspect view` in a browser ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`inspect view` serving the logs of a recorded HumanEval run (one server for the module)."""
    from ckpteval.export.to_inspect import write_inspect_logs
    from ckpteval.results.compare import InvocationSamples

    root = tmp_path_factory.mktemp("inspect-view")
    task = "adlr_humaneval_greedy"
    with pytest.MonkeyPatch.context() as patch:  # record_run saves an invocation record: keep it in this module's dir
        patch.setenv("XDG_STATE_HOME", str(root / "state"))
        results = record_run(root / "jobs", "bbbb0002", {task: humaneval_run})
    write_inspect_logs(
        InvocationSamples.load(root / "jobs" / "bbbb0002", results, {task: f"tasks/{task}"}), root / "logs"
    )
    port = free_port()
    inspect = Path(sys.executable).with_name("inspect")
    log = (root / "view.log").open("w")
    server = subprocess.Popen(
        [str(inspect), "view", "start", "--log-dir", str(root / "logs"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until(
            lambda: "adlr-humaneval-greedy" in (answers(url + "api/logs") or ""),
            timeout=300,
            what="inspect view to list the log",
            interval=0.5,
            unless=lambda: server.poll() is not None,
            context=lambda: (root / "view.log").read_text(),
        )
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _visible_text(dom: str) -> str:
    dom = re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S)
    return html.unescape(" | ".join(t.strip() for t in re.split(r"<[^>]+>", dom) if t.strip()))


@needs_inspect
@needs_browser
def test_inspect_view_shows_the_task_and_the_models_answers(viewer: str):
    # the viewer is a JS app that fetches the logs: the page is read again until it has rendered
    texts: list[str] = []

    def shown() -> bool:
        dom = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--virtual-time-budget=20000",
                "--dump-dom",
                viewer,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        texts.append(_visible_text(dom))
        return "adlr_humaneval_greedy/0" in texts[-1]

    wait_until(
        shown,
        timeout=300,
        what="the viewer to show a sample",
        interval=0,
        context=lambda: f"{len(texts)} tries: {texts[-1][:2000]}",
    )
    text = texts[-1]
    assert " | adlr_humaneval_greedy | " in text  # the task's name, on its own
    # the scorer with the task's value and stderr (results.json: 0.5, 0.2887), then the samples' table
    assert "pass_at_1__n=1__evalplus_sanitize" in text
    assert "greedy | 0.5 | stderr | 0.289" in text
    assert "Id | Input | Target | Answer | Score" in text
    # problem 0's answer: the code the model wrote (only in its response, not in the prompt)
    assert "for idx, elem in enumerate(numbers):" in text


@needs_inspect
def test_each_log_carries_what_produced_its_numbers() -> None:
    """results.json's provenance, as lines in the log's metadata: the checkpoint, and the task's own settings."""
    from ckpteval.export.to_inspect import task_log
    from ckpteval.results.compare import InvocationSamples
    from ckpteval.results.samples import SampleScore
    from tests.unit.results.test_provenance import RESULTS

    rows = [SampleScore("mmlu", 0, "doc0", {"acc": 1.0}), SampleScore("mmlu", 1, "doc1", {"acc": 0.0})]
    log = task_log(InvocationSamples(results=RESULTS, samples={"mmlu": rows}), "mmlu", rows)
    assert log.eval.metadata is not None
    assert log.eval.metadata["ckpteval_settings"] == "extra.num_fewshot=5, temperature=0.0"
    assert log.eval.metadata["ckpteval_checkpoint"].startswith("megatron-lm torch_dist iteration 1000")
    assert log.eval.metadata["ckpteval_endpoint"] == "abcd1234-5f2e"


def _gsm8k_with_a_long_prompt(task_dir: Path) -> None:
    """gsm8k whose first document's prompt is 10,000 characters (a long few-shot prompt), beginning and end
    distinct so a cut at either end shows."""
    gsm8k_run(task_dir / "output", [True, False])
    samples = next((task_dir / "output").rglob("samples_*.jsonl"))
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    for line in lines:
        if line["doc_id"] == 0:
            line["arguments"]["gen_args_0"]["arg_0"] = LONG_PROMPT
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))


LONG_PROMPT = "BEGIN " + "".join(f"example {i}: 2 + {i} = {i + 2}\n" for i in range(500))[: 10_000 - 10] + " END"


@needs_inspect
def test_a_long_prompt_survives_samples_json_and_the_inspect_export_whole(tmp_path: Path):
    from inspect_ai.log import read_eval_log

    assert len(LONG_PROMPT) == 10_000
    record_run(tmp_path / "jobs", "bbbb0002", {"gsm8k": _gsm8k_with_a_long_prompt})
    shown = runner.invoke(app, ["samples", "bbbb0002", "--json"])
    assert shown.exit_code == 0, shown.output
    prompts = {row["sample"]: row["prompt"] for row in json.loads(shown.output)["tasks"]["gsm8k"]}
    assert prompts["gsm8k/0"] == LONG_PROMPT
    result = runner.invoke(app, ["export", "bbbb", "--to", "inspect", "--out", str(tmp_path / "logs")])
    assert result.exit_code == 0, result.output
    log = read_eval_log(str(next((tmp_path / "logs").glob("*.eval"))))
    assert log.samples is not None
    assert next(s.input for s in log.samples if s.id == "gsm8k/0") == LONG_PROMPT
