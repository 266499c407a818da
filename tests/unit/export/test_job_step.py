"""The export step a detached job runs: the line in its script, and `python -m ckpteval.export` run as a
separate process on a job directory, as the job runs it (the Slurm run is in tests/integration)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ckpteval.cluster.remote import LocalRemote
from ckpteval.export.credentials import WandbKey, write_key_file
from ckpteval.export.job import export_step_command, stage_wandb_key, without_credentials
from tests.support.jobdirs import compiled_config_yaml, make_job_dir
from tests.support.wandb_login import fake_key, write_netrc
from tests.support.wandb_offline import offline_run_dirs, read_offline_run

CONFIG = ["export.wandb.enabled=true", "export.wandb.project=ckpteval-tests"]


def test_the_step_line_carries_mode_and_key_file_never_the_key():
    canary = fake_key("c")
    line = export_step_command(
        "/opt/venv/bin/python",
        "/lustre/me/jobs/ab12 cd",
        invocation="ab12cd34",
        tasks=[("adlr_mmlu", "tasks/adlr_mmlu")],
        key_file="/lustre/me/jobs/ab12 cd/.secrets/wandb_api_key",
        environ={"WANDB_MODE": "offline", "WANDB_API_KEY": canary, "WANDB_BASE_URL": "https://wandb.example"},
    )
    command, _, fallback = line.partition(" || ")
    assert shlex.split(command) == [
        "/opt/venv/bin/python",
        "-m",
        "ckpteval.export",
        "--job-dir",
        "/lustre/me/jobs/ab12 cd",
        "--invocation",
        "ab12cd34",
        "--wandb-key-file",
        "/lustre/me/jobs/ab12 cd/.secrets/wandb_api_key",
        "--wandb-mode",
        "offline",
        "--wandb-base-url",
        "https://wandb.example",
        "--task",
        "adlr_mmlu=tasks/adlr_mmlu",
    ]
    assert fallback.startswith("echo ") and "evaluate export ab12cd34" in fallback
    assert canary not in line


def test_staging_writes_the_login_key_owner_only_and_adds_it_to_the_secrets(tmp_path: Path, wandb_home: Path):
    from ckpteval.config.secrets import SecretValues

    write_netrc(wandb_home, fake_key("l"))
    secrets = SecretValues()
    with LocalRemote() as remote:
        path = stage_wandb_key(remote, str(tmp_path / "job"), secrets=secrets, environ={})
    assert path is not None
    assert Path(path).read_text().strip() == fake_key("l")
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert fake_key("l") in secrets


def test_staging_is_skipped_offline_and_without_a_login(tmp_path: Path):
    notes: list[str] = []
    with LocalRemote() as remote:
        assert (
            stage_wandb_key(remote, str(tmp_path / "a"), environ={"WANDB_MODE": "offline"}, on_note=notes.append)
            is None
        )
        assert not notes  # offline: no key is needed, nothing to say
        assert stage_wandb_key(remote, str(tmp_path / "b"), environ={}, on_note=notes.append) is None
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert len(notes) == 1 and "wandb login" in notes[0]


def _run_step(line: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = line.partition(" || ")[0]
    return subprocess.run(shlex.split(command), capture_output=True, text=True, env=env, timeout=300, check=False)


def _step_env(home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    return {**keep, "HOME": str(home), "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src")}


def test_the_step_exports_with_the_key_file(tmp_path: Path, wandb_home: Path):
    job = tmp_path / "jobs" / "ab12cd34"
    make_job_dir(job, "ab12cd34", config_yaml=compiled_config_yaml(CONFIG))
    with LocalRemote() as remote:
        key_file = write_key_file(remote, str(job), WandbKey(value=fake_key("j"), origin="env", source="WANDB_API_KEY"))
    line = export_step_command(
        sys.executable, str(job), invocation="ab12cd34", key_file=key_file, environ={"WANDB_MODE": "offline"}
    )
    done = _run_step(line, _step_env(wandb_home))
    assert done.returncode == 0, done.stderr
    assert "wandb sync" in done.stderr
    (run_dir,) = offline_run_dirs(job)
    assert read_offline_run(run_dir).summary["hellaswag/acc"] == 0.41
    assert fake_key("j") not in done.stdout + done.stderr


def test_the_step_refuses_a_key_file_others_can_read(tmp_path: Path, wandb_home: Path):
    job = tmp_path / "jobs" / "cd34ef56"
    make_job_dir(job, "cd34ef56", config_yaml=compiled_config_yaml(CONFIG))
    key_file = job / "key"
    key_file.write_text(fake_key("o"))
    key_file.chmod(0o644)
    line = export_step_command(sys.executable, str(job), invocation="cd34ef56", key_file=str(key_file), environ={})
    done = _run_step(line, _step_env(wandb_home))
    assert done.returncode == 2
    assert "readable by others" in done.stderr
    assert not (job / "wandb").exists()


def test_the_step_collects_results_when_the_job_did_not_write_them(tmp_path: Path, wandb_home: Path):
    job = tmp_path / "jobs" / "ef56ab78"
    make_job_dir(job, "ef56ab78", config_yaml=compiled_config_yaml(CONFIG), write_results=False)
    for task in ("adlr_mmlu", "hellaswag"):  # the job stopped before these finished
        (job / "tasks" / task / ".done").unlink()
    (job / "tasks" / "hellaswag" / "state").write_text("failed 1\n")
    (job / "tasks" / "adlr_mmlu" / "state").write_text("running\n")
    line = export_step_command(
        sys.executable,
        str(job),
        invocation="ef56ab78",
        tasks=[("adlr_mmlu", "tasks/adlr_mmlu"), ("hellaswag", "tasks/hellaswag")],
        environ={"WANDB_MODE": "offline"},
    )
    done = _run_step(line, _step_env(wandb_home))
    assert done.returncode == 0, done.stderr
    saved = json.loads((job / "results.json").read_text())
    assert saved["invocation"] == "ef56ab78"
    assert {t: v["status"] for t, v in saved["tasks"].items()} == {"adlr_mmlu": "cancelled", "hellaswag": "failed"}
    (run_dir,) = offline_run_dirs(job)
    run = read_offline_run(run_dir)
    assert run.exit_code == 1 and run.config["ckpteval"]["status"] == "failed"


def test_commands_can_run_without_the_credential_variables(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("WANDB_API_KEY", fake_key("v"))
    monkeypatch.setenv("HF_TOKEN", fake_key("h"))
    monkeypatch.setenv("CKPTEVAL_VISIBLE", "yes")
    with LocalRemote() as remote:
        env = remote.run(without_credentials(["env"])).stdout
    assert "CKPTEVAL_VISIBLE=yes" in env
    assert fake_key("v") not in env and fake_key("h") not in env
