"""Every table readable at 80 columns (and still a table at 140): no line wider than the terminal, no cell
or header cut to a few letters (`…`), every header and value there in full; and what `status` and
`resume` say about finished and stopped invocations."""

from __future__ import annotations

import os
import random
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.invocation.jobdir import JobDir
from ckpteval.invocation.record import load_record
from tests.support.comparisons import record_invocation, sample_rows

WIDTHS = (80, 140)


def _render(argv: list[str], width: int) -> str:
    result = CliRunner().invoke(app, argv, terminal_width=width, env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    for line in result.output.splitlines():
        assert len(line.rstrip()) <= width, f"{len(line)} > {width}: {line!r}"
    assert "…" not in result.output, result.output
    return result.output


@pytest.fixture
def recorded(isolated_user: Path) -> Path:
    """Three finished invocations of two tasks, two metrics each."""
    rng = random.Random(1)
    jobs = isolated_user / "jobs"
    for name, p in (("aaaa0001", 0.6), ("bbbb0002", 0.5), ("cccc0003", 0.55)):
        tasks = {
            task: sample_rows(task, {m: [1.0 if rng.random() < p else 0.0 for _ in range(100)] for m in metrics})
            for task, metrics in (("adlr_mmlu", ("exact_match", "acc_norm")), ("hellaswag", ("acc", "acc_norm")))
        }
        record_invocation(jobs, name, tasks, label=f"sft-step-{name}")
        record = load_record(name)
        record.model = f"/lustre/me/checkpoints/sft/iter_{name}"
        record.save()
    return jobs


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_keeps_every_header_and_number(recorded, width):
    out = _render(["compare", "aaaa0001", "bbbb0002"], width)
    for text in ("baseline", "candidate", "Δ [95% CI]", "test", "Holm p", "MDE", "verdict", "McNemar", "acc_norm"):
        assert text in out, text
    assert out.count("hellaswag") == 2 and out.count("adlr_mmlu") == 2  # one per metric, stacked or not


@pytest.mark.parametrize("width", WIDTHS)
def test_results_side_by_side_keeps_the_n_headers(recorded, width):
    out = _render(["results", "aaaa0001", "bbbb0002", "cccc0003"], width)
    for label in ("sft-step-aaaa0001", "sft-step-bbbb0002", "sft-step-cccc0003"):
        assert label in out
    assert out.count("0.") >= 12  # 4 metrics x 3 invocations, each score in full
    assert " n " in out or "│   n │" in out or "┃   n ┃" in out


@pytest.mark.parametrize("width", WIDTHS)
def test_tasks_keep_the_harness_apart(isolated_user, width):
    out = _render(["tasks", "humaneval"], width)
    assert "lm-evaluation-harness" in out and "bigcode-evaluation-harness" in out and "simple_evals" in out
    assert "needs" in out and "offline data" in out


@pytest.mark.parametrize("width", WIDTHS)
def test_whole_catalog_fits(isolated_user, width):
    out = _render(["tasks"], width)
    assert "adlr_mmlu" in out


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(
    "command", ["--help", "deploy --help", "compare --help", "status --help", "tasks --help", "serve-delegate --help"]
)
def test_help_is_not_cut(isolated_user, command, width):
    out = _render(command.split(), width)
    if command == "deploy --help":
        assert "--no-prefix-cache" in out and "latest_checkpointed_iteration.txt" in out
    if command == "serve-delegate --help":  # slime's flag names, whole
        assert "--max-concurrent-requests" in out and "--openai-model-name" in out


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [("--port", "0", "0 is not in 1..65535"), ("--max-concurrent-requests", "0", "0 is less than 1")],
)
def test_serve_delegate_ranges_are_checked_without_a_range_type(isolated_user, flag, value, why):
    # the ranges left the type column (it cut the flag's name at 80 columns): still one line, exit 2
    result = CliRunner().invoke(app, ["serve-delegate", flag, value], terminal_width=80)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"error: Invalid value for '{flag}': {why}." in result.output.splitlines()[0], result.output


def _finish(jobs: Path, invocation: str, *, seconds: float, code: int = 0) -> None:
    record = load_record(invocation)
    created = datetime.fromisoformat(record.created.replace("Z", "+00:00")).timestamp()
    finished = jobs / invocation / JobDir.FINISHED
    finished.parent.mkdir(parents=True, exist_ok=True)
    finished.write_text(f"{code}\n")
    os.utime(finished, (created + seconds, created + seconds))


@pytest.mark.parametrize("width", WIDTHS)
def test_status_lists_model_and_duration(recorded, width):
    _finish(recorded, "aaaa0001", seconds=125)
    out = _render(["status"], width)
    for text in ("model", "took", "sft/iter_aaaa0001", "2m 05s", "succeeded", "adlr_mmlu", "hellaswag"):
        assert text in out, text
    single = _render(["status", "aaaa0001"], width)
    assert "model: /lustre/me/checkpoints/sft/iter_aaaa0001  took: 2m 05s" in single


def test_status_of_a_finished_slurm_job_says_how_long_it_took(recorded):
    """A Slurm job's end is the time it wrote (`state/ended`): kept with the status seen at its end, or read
    from the job directory fetched here (whose file times are the fetch's, not the job's)."""
    from ckpteval.invocation.record import FinalStatus, SlurmSubmission

    record = load_record("cccc0003")
    created = datetime.fromisoformat(record.created.replace("Z", "+00:00")).timestamp()
    fetched = recorded / "cccc0003-fetched"
    (fetched / "state").mkdir(parents=True)
    (fetched / JobDir.ENDED).write_text(datetime.utcfromtimestamp(created + 65).strftime("%Y-%m-%dT%H:%M:%SZ\n"))
    (fetched / JobDir.FINISHED).write_text("0\n")  # its mtime is now: the fetch's
    record.executor, record.local_results_dir = "slurm", str(fetched)
    record.slurm = SlurmSubmission(connection={}, sbatch={}, job_ids=["42"])
    # the status seen at the job's end, kept by an older version: no end time in it
    record.final = FinalStatus(job="42", state="succeeded", detail="", log_tail="", deployment="", finished=0, tasks=[])
    record.save()
    assert "took: 1m 05s" in _render(["status", "cccc0003"], 80)
    record.final.ended = datetime.utcfromtimestamp(created + 125).strftime("%Y-%m-%dT%H:%M:%SZ")
    record.save()
    assert "took: 2m 05s" in _render(["status", "cccc0003"], 80)
    assert "2m 05s" in _render(["status"], 80)


def test_status_after_cancel_says_cancelled_not_running(recorded):
    # a job stopped under its tasks: no exit code, no process, the state files still say running and ready
    job = recorded / "bbbb0002"
    (job / "state").mkdir(exist_ok=True)
    (job / JobDir.DEPLOYMENT_STATE).write_text("ready\n")
    (job / JobDir.task_state("tasks/adlr_mmlu")).write_text("running\n")
    out = _render(["status", "bbbb0002"], 80)
    lines = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.startswith("│")}
    assert "cancelled" in out.splitlines()[0]
    assert "cancelled" in lines["deployment"] and "ready" not in lines["deployment"]
    assert "cancelled" in lines["adlr_mmlu"] and "running" not in out
    assert "cancelled" in lines["hellaswag"]  # never started: cancelled too (resume still runs it)


def test_resume_of_a_succeeded_invocation_does_nothing(recorded):
    _finish(recorded, "aaaa0001", seconds=10)
    before = sorted(p.relative_to(recorded) for p in recorded.rglob("*"))
    result = CliRunner().invoke(app, ["resume", "aaaa0001"], terminal_width=80)
    assert result.exit_code == 0, result.output
    assert "succeeded already: nothing to resume" in result.output
    assert sorted(p.relative_to(recorded) for p in recorded.rglob("*")) == before
