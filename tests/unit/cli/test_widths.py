"""Every table readable at 80 columns (and still a table at 140): no line wider than the terminal, no cell
or header cut to a few letters (`…`), every header and value there in full; what a score means (its chance
level, an n too small for a CI); and what `status` and `resume` say about finished and stopped invocations."""

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
from tests.support.lm_eval_runs import hellaswag_run, mmlu_str_run, record_run

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
    "command",
    ["--help", "deploy --help", "compare --help", "status --help", "tasks --help", "serve-delegate --help",
     "export-hf --help"],
)  # fmt: skip
def test_help_is_not_cut(isolated_user, command, width):
    out = _render(command.split(), width)
    if command == "deploy --help":
        assert "--no-prefix-cache" in out and "names) or an iter_" in out
    if command == "export-hf --help":
        assert "--no-check" in out and "--dtype" in out
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
    for text in ("model", "took", "sft/iter_aaaa0001", "2m 05s", "succeeded", "adlr_mmlu", "hellaswag", "scores"):
        assert text in out, text
    # each run's scores and the documents behind them tell three runs of the same tasks apart
    flat = " ".join(out.split())
    assert flat.count("n=100") == 6 and "adlr_mmlu 0." in flat and "hellaswag 0." in flat, out
    single = _render(["status", "aaaa0001"], width)
    assert "model: /lustre/me/checkpoints/sft/iter_aaaa0001  took: 2m 05s" in single


@pytest.fixture
def choice_tasks(isolated_user: Path) -> Path:
    """Invocations collected from lm-eval's own output of choice tasks: MMLU (a letter among 4 choices) with 25
    of 100 right, HellaSwag (4 endings) with 32 of 40 right; and HellaSwag on 2 documents."""
    jobs = isolated_user / "jobs"
    record_run(
        jobs,
        "dddd0004",
        {
            "adlr_mmlu": lambda d: mmlu_str_run(d, [i % 4 == 0 for i in range(100)]),
            "hellaswag": lambda d: hellaswag_run(d, [i % 5 != 0 for i in range(40)]),
        },
    )
    record_run(jobs, "eeee0005", {"hellaswag": lambda d: hellaswag_run(d, [True, False])})
    return jobs


@pytest.mark.parametrize("width", WIDTHS)
def test_a_score_says_its_chance_level_and_an_n_too_small_for_a_ci(choice_tasks, width):
    out = " ".join(_render(["results", "dddd0004"], width).split())
    # MMLU's 0.25 is what guessing scores: its CI includes chance, and the table says so beside the score
    assert "0.2500 ± 0.0435 (at chance: 0.25)" in out, out
    assert out.count("0.8000 ± 0.0641 (chance 0.25)") == 2, out  # hellaswag acc and acc_norm: above chance
    tiny = " ".join(_render(["results", "eeee0005"], width).split())
    assert "0.5000 (n too small for a CI; chance 0.25)" in tiny and "± 0.0000" not in tiny, tiny
    listed = " ".join(_render(["status"], width).split())
    assert "adlr_mmlu 0.2500 n=100 (at chance: 0.25)" in listed, listed
    assert "hellaswag 0.5000 n=2 (chance 0.25)" in listed, listed


def test_status_of_a_finished_slurm_job_says_how_long_it_took(recorded):
    """A Slurm job's end is the time it wrote (`state/ended`): kept with the status seen at its end, or read
    from the job directory fetched here (whose file times are the fetch's, not the job's)."""
    from ckpteval.execution.slurm_state import SlurmSubmission
    from ckpteval.invocation.record import FinalStatus

    record = load_record("cccc0003")
    created = datetime.fromisoformat(record.created.replace("Z", "+00:00")).timestamp()
    fetched = recorded / "cccc0003-fetched"
    (fetched / "state").mkdir(parents=True)
    (fetched / JobDir.ENDED).write_text(datetime.utcfromtimestamp(created + 65).strftime("%Y-%m-%dT%H:%M:%SZ\n"))
    (fetched / JobDir.FINISHED).write_text("0\n")  # its mtime is now: the fetch's
    record.executor, record.local_results_dir = "slurm", str(fetched)
    record.placement = SlurmSubmission(connection={}, sbatch={}, job_ids=["42"])
    # the status seen at the job's end, kept by an older version: no end time in it
    record.final = FinalStatus(job="42", state="succeeded", detail="", log_tail="", deployment="", finished=0, tasks=[])
    record.save()
    assert "took: 1m 05s" in _render(["status", "cccc0003"], 80)
    record.final.ended = datetime.utcfromtimestamp(created + 125).strftime("%Y-%m-%dT%H:%M:%SZ")
    record.save()
    assert "took: 2m 05s" in _render(["status", "cccc0003"], 80)
    assert "2m 05s" in _render(["status"], 80)


@pytest.mark.parametrize("width", WIDTHS)
def test_status_after_cancel_says_cancelled_not_running(recorded, width):
    # a job stopped under its tasks: no exit code, no process, the state files still say running and ready
    job = recorded / "bbbb0002"
    (job / "state").mkdir(exist_ok=True)
    (job / JobDir.DEPLOYMENT_STATE).write_text("ready\n")
    (job / JobDir.task_state("tasks/adlr_mmlu")).write_text("running\n")
    # how its requests went, as the job script marks it after the request-settings probe
    probe = "honoured: 4 rounds of concurrent requests (adlr_mmlu, hellaswag) each answered as when sent alone"
    (job / JobDir.REQUESTS).write_text(f"side by side: {probe}\n")
    out = _render(["status", "bbbb0002"], width)
    lines = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.startswith("│")}
    assert "cancelled" in out.splitlines()[0]
    assert "cancelled" in lines["deployment"] and "ready" not in lines["deployment"]
    assert "cancelled" in lines["adlr_mmlu"] and "running" not in out
    assert "cancelled" in lines["hellaswag"]  # never started: cancelled too (resume still runs it)
    # the requests in words, not the job's mark ("requests: side by side: honoured: 4 rounds...")
    flat = " ".join(out.split())
    assert "side by side: honoured" not in flat, out
    assert (
        "task requests: side by side; the endpoint answered each with its own settings (probe: 4 rounds of "
        "concurrent requests (adlr_mmlu, hellaswag) each answered as when sent alone)" in flat
    ), out


@pytest.mark.parametrize("width", WIDTHS)
def test_status_says_the_deployment_serves_on_another_port(recorded, width):
    # the job's mark when the planned port was taken (tests/unit/job/test_script.py: the job writes it)
    job = recorded / "aaaa0001"
    (job / "state").mkdir(exist_ok=True)
    moved = "port 8000 was taken: the deployment serves on port 41873 instead"
    (job / JobDir.DEPLOYMENT_MOVED).write_text(f"{moved}\n")
    assert moved in " ".join(_render(["status", "aaaa0001"], width).split())


@pytest.mark.parametrize("width", WIDTHS)
def test_status_without_an_id_lists_then_shows_the_latest_in_full(recorded, width):
    from ckpteval.invocation.record import list_records

    latest = list_records()[0].id
    job = recorded / latest
    (job / "state").mkdir(exist_ok=True)
    (job / JobDir.task_state("tasks/adlr_mmlu")).write_text("succeeded\n")
    out = _render(["status"], width)
    listing, _, full = out.partition(f"the latest invocation ({latest})")
    assert all(i in listing for i in ("aaaa0001", "bbbb0002", "cccc0003")), out
    assert full.splitlines()[1].startswith(f"{latest}  "), full  # as `evaluate status ID` shows it
    assert full.strip().splitlines()[1:] == _render(["status", latest], width).strip().splitlines(), full


def test_resume_of_a_succeeded_invocation_does_nothing(recorded):
    _finish(recorded, "aaaa0001", seconds=10)
    before = sorted(p.relative_to(recorded) for p in recorded.rglob("*"))
    result = CliRunner().invoke(app, ["resume", "aaaa0001"], terminal_width=80)
    assert result.exit_code == 0, result.output
    assert "succeeded already: nothing to resume" in result.output
    assert sorted(p.relative_to(recorded) for p in recorded.rglob("*")) == before


LONG_OVERRIDE = "evaluation.nemo_evaluator_config.config.params.limit_samples=null"


def _outside_scripts(output: str) -> list[str]:
    """The lines of a dry run outside its copyable scripts (a `job script` section runs to the next rule)."""
    kept, in_script = [], False
    for line in output.splitlines():
        if line.startswith(("job script", "sbatch script")):
            in_script = True
            continue
        if in_script and "───" in line and not line.startswith((" ", "#")):
            in_script = line.startswith(("job script", "sbatch script"))
        if not in_script:
            kept.append(line)
    return kept


@pytest.mark.parametrize("width", WIDTHS)
def test_the_dry_run_fits_outside_its_scripts_and_cuts_no_value(tiny_checkpoint, isolated_user, width):
    argv = ["-c", "tiny", "-t", "adlr_mmlu,gsm8k", "deployment.prepare=null", f"run.model={tiny_checkpoint}"]
    result = CliRunner().invoke(
        app, [*argv, LONG_OVERRIDE, "--dry-run"], terminal_width=width, env={"COLUMNS": str(width)}
    )
    assert result.exit_code == 0, result.output
    lines = _outside_scripts(result.output)
    # every line fits, but a single word longer than the room (a path), left whole to copy
    too_wide = [ln for ln in lines if len(ln.rstrip()) > width and len(ln.split()) > 1]
    assert not too_wide, "\n".join(too_wide)
    assert "…" not in "\n".join(lines)
    text = "\n".join(lines)
    for seen in ("forward", "num_query_groups=", "export-deploy yes", "group 1: adlr_mmlu", "group 2: gsm8k"):
        assert seen in text, seen
    # the long override whole: its key on one line, its value on the next where it does not fit
    header = "".join(ln.strip(" │") for ln in lines[: lines.index(next(ln for ln in lines if "tasks" in ln))])
    assert LONG_OVERRIDE in header.replace(" ", ""), header
    # its invocation id is this dry run's alone: the real run gets its own
    assert "(thisdryrun's;therungetsitsown)" in header.replace(" ", ""), header


@pytest.mark.parametrize("width", WIDTHS)
def test_inspect_fits(tiny_checkpoint, isolated_user, width):
    result = CliRunner().invoke(
        app, ["inspect", str(tiny_checkpoint)], terminal_width=width, env={"COLUMNS": str(width)}
    )
    assert result.exit_code == 0, result.output
    too_wide = [ln for ln in result.output.splitlines() if len(ln.rstrip()) > width and len(ln.split()) > 1]
    assert not too_wide, "\n".join(too_wide)
    assert "num_query_groups=" in result.output and "…" not in result.output


def test_status_json_gives_states_as_words_and_the_exit_code_apart(recorded):
    import json

    _finish(recorded, "cccc0003", seconds=30, code=1)
    job = recorded / "cccc0003"
    (job / "state").mkdir(exist_ok=True)
    (job / JobDir.task_state("tasks/adlr_mmlu")).write_text("failed 1\n")
    (job / JobDir.task_state("tasks/hellaswag")).write_text("succeeded\n")
    result = CliRunner().invoke(app, ["status", "cccc0003", "--json"])
    assert result.exit_code == 0, result.output
    [status] = json.loads(result.stdout)
    assert status["state"] == "failed"
    tasks = {t["name"]: t for t in status["tasks"]}
    assert (tasks["adlr_mmlu"]["state"], tasks["adlr_mmlu"]["exit_code"]) == ("failed", 1)
    assert tasks["hellaswag"]["state"] == "succeeded" and "exit_code" not in tasks["hellaswag"]


def test_logs_without_an_id_means_the_latest(recorded):
    from ckpteval.invocation.record import list_records

    latest = list_records()[0]
    log = recorded / latest.id / JobDir.JOB_LOG
    log.parent.mkdir(exist_ok=True)
    log.write_text("the latest job's own line\n")
    result = CliRunner().invoke(app, ["logs"])
    assert result.exit_code == 0, result.output
    assert "the latest job's own line" in result.output and f"the latest invocation: {latest.id}" in result.output


def test_resume_says_which_invocation_and_what_it_skips_replays_and_runs(recorded):
    import ckpteval
    from ckpteval.cli.resume import resume_plan

    job = recorded / "bbbb0002"
    (job / "state").mkdir(exist_ok=True)
    (job / JobDir.DEPLOYMENT_STATE).write_text("ready\n")
    (job / JobDir.task_state("tasks/adlr_mmlu")).write_text("succeeded\n")
    (job / JobDir.task_state("tasks/hellaswag")).write_text("running\n")
    record = load_record("bbbb0002")
    record.command_line = ["evaluate", "-c", "sft", "-t", "adlr_mmlu,hellaswag"]
    record.save()
    found = ckpteval.status("bbbb0002")
    text = resume_plan(found)
    assert text.splitlines()[0].startswith("resuming invocation bbbb0002")
    assert "first run as: evaluate -c sft -t adlr_mmlu,hellaswag" in text
    assert "skips (finished): adlr_mmlu" in text
    assert "hellaswag" in text.split("skips (finished): adlr_mmlu", 1)[1]  # replayed or run, never skipped
    assert all(len(line) <= 80 for line in text.splitlines())


FIRST_HOUR_MISTAKES = [
    (["-c", "tiny", "-t", "mtbench", "-d"], "mtbench is scored by a judge model and no judge is set: add judge=api"),
    (["-c", "tiny", "--batch_size", "8"], "deployment.max_batch_size=8"),
    (["-c", "tiny", "--device", "cuda:0"], "pass deployment.device=cuda"),
    (["-c", "tiny", "--model_args", "pretrained=x"], "the checkpoint is --model PATH (run.model=PATH)"),
    (
        ["-c", "tiny", "-d", "exection.x=1"],
        "No section 'exection': did you mean execution? Its keys: type, output_dir,",
    ),
    (["version"], "Did you mean `evaluate --version`?"),
    (["-c", "tiny", "-d", "-t", ""], "-t '' names no task."),
    (["-c", "tiny", "--limit", "2x"], "--limit takes a number of documents per task (5), a fraction"),
]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(("argv", "said"), FIRST_HOUR_MISTAKES, ids=[" ".join(a) for a, _ in FIRST_HOUR_MISTAKES])
def test_a_first_hour_mistake_is_one_line_with_the_fix_at_any_width(isolated_user, argv, said, width):
    """The mistakes of issue 42's first hour, each refused before anything is done (exit 2) with the fix in its
    one line, whole: an error line is not wrapped by us (the terminal wraps it; nothing is cut)."""
    result = CliRunner().invoke(app, argv, terminal_width=width, env={"COLUMNS": str(width)})
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output and "…" not in result.output, result.output
    assert not (isolated_user / "results").exists()
