"""`evaluate export INVOCATION [--to ...]` on a recorded invocation, through the real command line."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.invocation.record import InvocationRecord, TaskEntry
from tests.support.jobdirs import compiled_config_yaml, make_job_dir
from tests.support.wandb_offline import offline_run_dirs, read_offline_run

runner = CliRunner()


def _record(tmp_path: Path, invocation: str, *overrides: str) -> Path:
    job = tmp_path / "results" / invocation
    make_job_dir(job, invocation, config_yaml=compiled_config_yaml(overrides))
    InvocationRecord(
        id=invocation,
        created="2026-11-22T01:00:00Z",
        mode="local",
        profile="local",
        executor="local",
        job_dir=str(job),
        tasks=[TaskEntry("adlr_mmlu", "tasks/adlr_mmlu"), TaskEntry("hellaswag", "tasks/hellaswag")],
        local_results_dir=str(job),
    ).save()
    return job


def test_export_to_wandb_offline_by_prefix(tmp_path: Path):
    job = _record(tmp_path, "d00dfeed", "export.wandb.project=evals")
    result = runner.invoke(app, ["export", "d00d", "--to", "wandb"], env={"WANDB_MODE": "offline"})
    assert result.exit_code == 0, result.output
    (run_dir,) = offline_run_dirs(job)
    assert f"wandb sync {run_dir}" in result.output
    run = read_offline_run(run_dir)
    assert (run.run_id, run.project) == ("ckpteval-d00dfeed", "evals")
    assert run.summary["adlr_mmlu/exact_match"] == 0.3125


def test_the_configs_destinations_are_the_default(tmp_path: Path):
    job = _record(tmp_path, "beefbeef", "export.wandb.enabled=true", "export.wandb.project=evals")
    result = runner.invoke(app, ["export", "beefbeef"], env={"WANDB_MODE": "offline"})
    assert result.exit_code == 0, result.output
    assert len(offline_run_dirs(job)) == 1


def test_nothing_enabled_and_nothing_asked_is_an_error(tmp_path: Path):
    _record(tmp_path, "cafe0001")
    result = runner.invoke(app, ["export", "cafe0001"])
    assert result.exit_code == 1
    assert "has no export enabled" in result.output
    assert "--to wandb" in result.output
    assert "Traceback" not in result.output


def test_not_logged_in_fails_the_command_with_how_to_log_in(tmp_path: Path):
    job = _record(tmp_path, "cafe0002")
    result = runner.invoke(app, ["export", "cafe0002", "--to", "wandb"])
    assert result.exit_code == 1
    assert "no W&B login found" in result.output and "wandb login" in result.output
    assert "Traceback" not in result.output
    assert not (job / "wandb").exists()


def test_an_unknown_invocation_is_one_line(tmp_path: Path):
    result = runner.invoke(app, ["export", "nope", "--to", "mlflow"])
    assert result.exit_code == 2
    assert "No invocation 'nope'" in result.output


def test_an_unknown_destination_is_refused():
    result = runner.invoke(app, ["export", "x", "--to", "tensorboard"])
    assert result.exit_code == 2
    assert "tensorboard" in result.output


def test_the_command_line_starts_without_wandb_mlflow_or_inspect_ai():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ckpteval.cli.main import main\n"
        "try:\n    main(['export', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('wandb', 'mlflow', 'torch', 'nemo_run', 'inspect_ai') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
