"""W&B export, for real: offline runs written by wandb itself and read back from their run files;
the not-logged-in skip; an unreachable server (a closed local port) that fails in seconds and can be
retried. (Online resume against a real server cannot run here: no W&B server is reachable.)"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from ckpteval.export.content import read_saved_config
from ckpteval.export.credentials import WandbKey
from ckpteval.export.invocation import export_invocation, export_section
from ckpteval.export.outcome import ExportOutcome
from ckpteval.results.model import InvocationResults
from tests.support.jobdirs import compiled_config_yaml, make_job_dir, sample_results
from tests.support.wandb_login import fake_key
from tests.support.wandb_offline import offline_run_dirs, read_offline_run

TASK_DIRS = {"adlr_mmlu": "tasks/adlr_mmlu", "hellaswag": "tasks/hellaswag"}


def _job(tmp_path: Path, invocation: str, *overrides: str, failed_task: bool = False) -> tuple[Path, InvocationResults]:
    job = tmp_path / "out" / invocation
    config = compiled_config_yaml(["export.wandb.enabled=true", "export.wandb.project=ckpteval-tests", *overrides])
    results = make_job_dir(
        job, invocation, config_yaml=config, results=sample_results(invocation, failed_task=failed_task)
    )
    return job, results


def _export(job: Path, results: InvocationResults, environ: dict[str, str], **kwargs: Any) -> list[ExportOutcome]:
    from ckpteval.cli.console import print_outcome  # what the CLI shows per destination

    export = export_section(read_saved_config(job / "config.yaml"))
    kwargs.setdefault("report", print_outcome)
    return export_invocation(results, job, export, task_dirs=TASK_DIRS, environ=environ, **kwargs)


def test_one_offline_run_per_invocation_holds_metrics_config_and_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    job, results = _job(tmp_path, "a1b2c3d4", "export.wandb.tags=[sft,nightly]", "export.wandb.description=smoke")
    (outcome,) = _export(job, results, {"WANDB_MODE": "offline"})
    assert outcome.status == "exported"
    (run_dir,) = offline_run_dirs(job)
    assert outcome.sync_command == f"wandb sync {run_dir}"
    assert f"wandb sync {run_dir}" in capsys.readouterr().err

    run = read_offline_run(run_dir)
    assert (run.run_id, run.project, run.group, run.name) == (
        "ckpteval-a1b2c3d4",
        "ckpteval-tests",
        "a1b2c3d4",
        "smollm2-smoke",  # the invocation's label (run.name)
    )
    assert (run.job_type, run.tags, run.notes, run.exit_code) == ("evaluation", ["sft", "nightly"], "smoke", 0)
    assert run.summary["adlr_mmlu/exact_match"] == 0.3125
    assert run.summary["adlr_mmlu/exact_match_stderr"] == 0.0231
    assert run.summary["hellaswag/acc_norm"] == 0.47
    assert run.history[0]["hellaswag/acc"] == 0.41
    assert run.config["deployment"]["type"] == "megatron"
    assert run.config["ckpteval"]["invocation"] == "a1b2c3d4"
    (artifact,) = run.artifacts
    assert (artifact.name, artifact.type) == ("results-a1b2c3d4", "evaluation_result")
    assert "tasks/hellaswag/output/results.yml" in artifact.files
    assert not any("cache" in name or name.endswith(".lock") for name in artifact.files)
    staged = json.loads(artifact.files["results.json"].read_text())
    assert staged["tasks"]["adlr_mmlu"]["metrics"]["exact_match"]["value"] == 0.3125


def test_per_task_runs_carry_their_own_task(tmp_path: Path):
    job, results = _job(tmp_path, "e5f6a7b8", "export.wandb.log_mode=per_task", "export.wandb.name=nightly")
    (outcome,) = _export(job, results, {"WANDB_MODE": "offline"})
    assert outcome.status == "exported"
    runs = {r.run_id: r for r in map(read_offline_run, offline_run_dirs(job))}
    assert sorted(runs) == ["ckpteval-e5f6a7b8-adlr_mmlu", "ckpteval-e5f6a7b8-hellaswag"]
    hellaswag = runs["ckpteval-e5f6a7b8-hellaswag"]
    assert (hellaswag.group, hellaswag.name) == ("e5f6a7b8", "nightly-hellaswag")
    assert "hellaswag/acc" in hellaswag.summary and "adlr_mmlu/exact_match" not in hellaswag.summary
    (artifact,) = hellaswag.artifacts
    assert artifact.name == "results-e5f6a7b8-hellaswag"
    assert not any(name.startswith("tasks/adlr_mmlu/") for name in artifact.files)


def test_a_failed_task_marks_the_run_failed_and_keeps_the_others(tmp_path: Path):
    job, results = _job(tmp_path, "c0ffee00", failed_task=True)
    _export(job, results, {"WANDB_MODE": "offline"})
    (run_dir,) = offline_run_dirs(job)
    run = read_offline_run(run_dir)
    assert run.exit_code == 1
    assert "adlr_mmlu/exact_match" in run.summary
    assert not any(k.startswith("hellaswag/") for k in run.summary)
    assert run.config["ckpteval"]["tasks"]["hellaswag"] == "failed"


def test_exporting_again_uses_the_same_run_id(tmp_path: Path):
    job, results = _job(tmp_path, "0badcafe")
    _export(job, results, {"WANDB_MODE": "offline"})
    _export(job, results, {"WANDB_MODE": "offline"})
    ids = [read_offline_run(d).run_id for d in offline_run_dirs(job)]
    assert ids == ["ckpteval-0badcafe", "ckpteval-0badcafe"]


def test_not_logged_in_skips_with_one_line_saying_how(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    job, results = _job(tmp_path, "11112222")
    (outcome,) = _export(job, results, {})
    assert outcome.status == "skipped" and outcome.ok
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "wandb login" in err and "WANDB_MODE=offline" in err and "evaluate export 11112222" in err
    assert not (job / "wandb").exists()


def test_disabled_mode_skips(tmp_path: Path):
    job, results = _job(tmp_path, "33334444")
    (outcome,) = _export(job, results, {"WANDB_MODE": "disabled"}, report=None)
    assert outcome.status == "skipped"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_server_fails_fast_keeps_results_and_can_be_retried(tmp_path: Path):
    job, results = _job(tmp_path, "55556666", "export.wandb.timeout=10")
    canary = fake_key("q")
    environ = {"WANDB_BASE_URL": f"http://127.0.0.1:{_closed_port()}", "WANDB_API_KEY": canary}
    start = time.monotonic()
    (outcome,) = _export(job, results, environ)
    elapsed = time.monotonic() - start
    assert outcome.status == "failed"
    assert elapsed < 90, elapsed
    assert "ckpteval-55556666" in outcome.message
    assert "evaluate export 55556666 --to wandb" in (outcome.hint or "")
    assert (job / "results.json").is_file()
    # the key went to wandb in memory: not into any file wandb or we wrote
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert canary.encode() not in path.read_bytes(), path
    (retry,) = _export(job, results, {"WANDB_MODE": "offline"})
    assert retry.status == "exported"


def test_a_given_key_is_used_without_looking_for_a_login(tmp_path: Path):
    job, results = _job(tmp_path, "77778888", "export.wandb.timeout=5")
    key = WandbKey(value=fake_key("k"), origin="file", source="/job/.secrets/wandb_api_key")
    environ = {"WANDB_BASE_URL": f"http://127.0.0.1:{_closed_port()}"}
    (outcome,) = _export(job, results, environ, key=key, report=None)
    assert outcome.status == "failed"  # it tried (no "not logged in" skip), and the server is not there


def test_what_the_invocation_cost_is_in_the_run_summary(tmp_path: Path):
    import dataclasses

    from ckpteval.results.usage import Usage

    job, results = _job(tmp_path, "c0570001")
    usage = Usage("sacct", 754.0, 8, 1.675556, {"startup": 312.0, "tasks": 430.0, "idle": 12.0})
    (outcome,) = _export(job, dataclasses.replace(results, usage=usage.to_json()), {"WANDB_MODE": "offline"})
    assert outcome.status == "exported"
    (run_dir,) = offline_run_dirs(job)
    summary = read_offline_run(run_dir).summary
    assert (summary["usage/gpu_hours"], summary["usage/gpus"], summary["usage/wall_seconds"]) == (1.675556, 8, 754)
    assert (summary["usage/startup_seconds"], summary["usage/tasks_seconds"], summary["usage/idle_seconds"]) == (
        312,
        430,
        12,
    )
