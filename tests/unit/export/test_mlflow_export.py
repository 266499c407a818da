"""MLflow export against real tracking stores, read back with MlflowClient: a SQLite store (fast), and a
real `mlflow server` on 127.0.0.1 over HTTP (slow: the server takes ~50 s to start on 2 cores)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpteval.export.content import read_saved_config
from ckpteval.export.invocation import export_invocation, export_section
from ckpteval.export.outcome import ExportOutcome
from ckpteval.results.model import InvocationResults
from tests.support.jobdirs import compiled_config_yaml, make_job_dir, sample_results
from tests.support.waiting import answers, wait_until


def _job(tmp_path: Path, invocation: str, uri: str, *, failed_task: bool = False) -> tuple[Path, InvocationResults]:
    job = tmp_path / "out" / invocation
    config = compiled_config_yaml(
        [
            "export.mlflow.enabled=true",
            f"export.mlflow.tracking_uri={uri}",
            "export.mlflow.experiment_name=ckpteval-tests",
            "+export.mlflow.tags.team=llm",
        ]
    )
    results = make_job_dir(
        job, invocation, config_yaml=config, results=sample_results(invocation, failed_task=failed_task)
    )
    return job, results


def _export(job: Path, results: InvocationResults) -> list[ExportOutcome]:
    export = export_section(read_saved_config(job / "config.yaml"))
    return export_invocation(results, job, export, report=None)


def _runs(uri: str, invocation: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("ckpteval-tests")
    assert experiment is not None
    return client.search_runs([experiment.experiment_id], filter_string=f"tags.`ckpteval.invocation` = '{invocation}'")


def _check_run(uri: str, invocation: str) -> str:
    from mlflow.tracking import MlflowClient

    (run,) = _runs(uri, invocation)
    data = run.data
    assert data.metrics["adlr_mmlu/exact_match"] == 0.3125
    assert data.metrics["hellaswag/acc_norm_stderr"] == 0.05
    assert data.params["deployment.type"] == "megatron"
    assert data.params["evaluation.nemo_evaluator_config.config.params.limit_samples"] == "1"  # tiny.yaml
    assert data.tags["team"] == "llm"
    assert data.tags["ckpteval.status"] == "succeeded"
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "smollm2-smoke"
    client = MlflowClient(tracking_uri=uri)
    top = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"results.json", "config.yaml", "job.yaml", "tasks"} <= top
    output = {f.path for f in client.list_artifacts(run.info.run_id, "tasks/hellaswag/output")}
    assert "tasks/hellaswag/output/results.yml" in output
    assert not any("cache" in p for p in output)
    return str(run.info.run_id)


def test_export_to_a_sqlite_store_and_again_without_duplicates(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job, results = _job(tmp_path, "9a9b9c9d", uri)
    (outcome,) = _export(job, results)
    assert outcome.status == "exported", outcome
    run_id = _check_run(uri, "9a9b9c9d")
    (again,) = _export(job, results)
    assert again.status == "exported" and again.locations == (run_id,)
    assert _check_run(uri, "9a9b9c9d") == run_id
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, "adlr_mmlu/exact_match")
    assert len(history) == 1


def test_a_failed_invocation_is_a_failed_run(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job, results = _job(tmp_path, "8a8b8c8d", uri, failed_task=True)
    _export(job, results)
    (run,) = _runs(uri, "8a8b8c8d")
    assert run.info.status == "FAILED"
    assert "hellaswag/acc" not in run.data.metrics


def test_an_unreachable_server_fails_fast(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job, results = _job(tmp_path, "7a7b7c7d", f"http://127.0.0.1:{port}")
    start = time.monotonic()
    (outcome,) = _export(job, results)
    assert time.monotonic() - start < 15
    assert outcome.status == "failed"
    assert "cannot be reached" in outcome.message
    assert "evaluate export" in (outcome.hint or "")


def test_no_tracking_uri_says_where_to_set_one(tmp_path: Path):
    job = tmp_path / "out" / "6a6b6c6d"
    results = make_job_dir(job, "6a6b6c6d", config_yaml=compiled_config_yaml(["export.mlflow.enabled=true"]))
    (outcome,) = _export(job, results)
    assert outcome.status == "failed"
    assert "export.mlflow.tracking_uri" in (outcome.hint or "")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlflow-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(root / "server.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: answers(f"{url}/health", timeout=2) is not None,
            timeout=300,
            what="the mlflow server",
            interval=0.5,
            unless=lambda: proc.poll() is not None,
            context=lambda: (root / "server.log").read_text()[-3000:],
        )
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.mark.slow
def test_export_to_an_mlflow_server_over_http(tmp_path: Path, mlflow_server: str):
    job, results = _job(tmp_path, "5a5b5c5d", mlflow_server)
    (outcome,) = _export(job, results)
    assert outcome.status == "exported", outcome
    run_id = _check_run(mlflow_server, "5a5b5c5d")
    (again,) = _export(job, results)
    assert again.locations == (run_id,)


def test_what_the_invocation_cost_is_logged_as_metrics(tmp_path: Path):
    import dataclasses

    from mlflow.tracking import MlflowClient

    from ckpteval.results.usage import Usage

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job, results = _job(tmp_path, "c0570002", uri)
    usage = Usage("job clock", 96.0, 0, 0.0, {"startup": 30.0, "tasks": 60.0, "idle": 6.0}, cpu_seconds=150.5)
    (outcome,) = _export(job, dataclasses.replace(results, usage=usage.to_json()))
    assert outcome.status == "exported", outcome
    (run,) = _runs(uri, "c0570002")
    metrics = MlflowClient(tracking_uri=uri).get_run(run.info.run_id).data.metrics
    assert metrics["usage/gpu_hours"] == 0.0 and metrics["usage/cpu_seconds"] == 150.5
    assert metrics["usage/wall_seconds"] == 96.0 and metrics["usage/tasks_seconds"] == 60.0
