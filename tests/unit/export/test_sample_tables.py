"""Exports carry the per-sample scores: a W&B Table in the results artifact (read back from the offline run
file) and an MLflow table artifact (read back from a SQLite store), with the standard errors as metrics."""

from __future__ import annotations

import json
from pathlib import Path

from ckpteval.export.content import read_saved_config
from ckpteval.export.invocation import export_invocation, export_section
from ckpteval.results.samples import SAMPLES_FILE, write_samples
from tests.support.comparisons import sample_rows
from tests.support.jobdirs import compiled_config_yaml, make_job_dir, sample_results
from tests.support.wandb_offline import offline_run_dirs, read_offline_run

TASK_DIRS = {"adlr_mmlu": "tasks/adlr_mmlu", "hellaswag": "tasks/hellaswag"}
SCORES = [1, 0, 0, 1, 1]


def _job(tmp_path: Path, invocation: str, *overrides: str) -> Path:
    job = tmp_path / "out" / invocation
    make_job_dir(job, invocation, config_yaml=compiled_config_yaml(list(overrides)), results=sample_results(invocation))
    write_samples(job / "tasks" / "adlr_mmlu" / SAMPLES_FILE, sample_rows("mmlu_str_anatomy", {"exact_match": SCORES}))
    return job


def test_wandb_artifact_holds_the_per_sample_table(tmp_path: Path):
    job = _job(tmp_path, "5a5b5c5d", "export.wandb.enabled=true", "export.wandb.project=ckpteval-tests")
    results = sample_results("5a5b5c5d")
    export = export_section(read_saved_config(job / "config.yaml"))
    (outcome,) = export_invocation(results, job, export, task_dirs=TASK_DIRS, environ={"WANDB_MODE": "offline"})
    assert outcome.status == "exported", outcome
    run = read_offline_run(offline_run_dirs(job)[0])
    assert run.summary["adlr_mmlu/exact_match_stderr"] == 0.0231
    (artifact,) = run.artifacts
    table = json.loads(artifact.files["samples/adlr_mmlu.table.json"].read_text())
    assert table["columns"] == ["sample", "task", "doc", "repeat", "exact_match"]
    assert [row[0] for row in table["data"]] == [f"mmlu_str_anatomy/{i}" for i in range(5)]
    assert [row[4] for row in table["data"]] == SCORES
    assert "tasks/adlr_mmlu/samples.jsonl" in artifact.files
    assert "samples/hellaswag.table.json" not in artifact.files  # no per-sample file, no table


def test_mlflow_run_holds_the_per_sample_table(tmp_path: Path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job = _job(
        tmp_path,
        "6a6b6c6d",
        "export.mlflow.enabled=true",
        f"export.mlflow.tracking_uri={uri}",
        "export.mlflow.experiment_name=ckpteval-tests",
    )
    export = export_section(read_saved_config(job / "config.yaml"))
    (outcome,) = export_invocation(sample_results("6a6b6c6d"), job, export, report=None)
    assert outcome.status == "exported", outcome
    client = MlflowClient(tracking_uri=uri)
    (run_id,) = outcome.locations
    assert client.get_run(run_id).data.metrics["adlr_mmlu/exact_match_stderr"] == 0.0231
    local = client.download_artifacts(run_id, "samples/adlr_mmlu.json", str(tmp_path / "dl"))
    table = json.loads(Path(local).read_text())
    assert table["columns"][:5] == ["sample", "task", "doc", "repeat", "exact_match"]
    assert [row[4] for row in table["data"]] == SCORES
    assert "tasks/adlr_mmlu/samples.jsonl" in {f.path for f in client.list_artifacts(run_id, "tasks/adlr_mmlu")}
