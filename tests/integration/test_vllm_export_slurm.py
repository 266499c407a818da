"""vLLM on a Megatron checkpoint on the local Slurm cluster: `evaluate -c tiny deployment=vllm run.model=<the tiny
Megatron checkpoint> --batch CI`, twice at once.

Real here: Slurm, the export step (`python -m ckpteval.hfexport cached`: megatron-core reads the checkpoint,
the export is written into the cache under `remote_job_dir`, transformers and the builtin engine compare it),
the flock on the cache entry, the job script's health wait and identity check, the request-settings probe, the
task client (nemo-evaluator + lm-eval's echo + logprobs scoring) in its squashed image. A stand-in: vLLM itself
(tests/support/vllm_standin.py, `vllm serve` with vLLM's command line and OpenAI routes, computing with
transformers on the CPU), found first on the job's PATH as the vLLM image has its own.

The two jobs are held and released together: one exports (tensors written), the other waits for the entry's
lock and reuses it (0 tensors written, the parity kept); both score the same. A dry run with --check then says
the export is cached.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.execution.slurm_state import slurm_job_id
from ckpteval.invocation.record import list_records, load_record
from tests.integration.conftest import REPO
from tests.integration.slurm_jobs import free_port, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
runner = CliRunner()
TASK = "hellaswag"  # log-likelihood scoring through vLLM's echo + logprobs


def cli(*argv: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(argv))
    assert "Traceback" not in result.output.split("last lines of")[0], result.output
    return result


@pytest.fixture
def standin_bin(infra) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """A directory with `vllm` (the stand-in) that the CI user's jobs can run."""
    directory = Path(infra.user_home) / "ckpteval-tests" / f"vllm-standin-{uuid.uuid4().hex[:8]}"
    directory.mkdir(parents=True)
    vllm = directory / "vllm"
    python = REPO / ".venv" / "bin" / "python"
    vllm.write_text(f'#!/bin/sh\nexec {python} {REPO / "tests" / "support" / "vllm_standin.py"} "$@"\n')
    vllm.chmod(0o755)
    directory.chmod(0o755)
    yield directory
    vllm.unlink()
    directory.rmdir()


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(infra) -> Iterator[None]:  # type: ignore[no-untyped-def]
    yield
    for record in list_records():
        if slurm_job_id(record):
            subprocess.run(["scancel", str(slurm_job_id(record))], capture_output=True)


def test_vllm_exports_once_waits_for_the_lock_reuses_and_scores(  # type: ignore[no-untyped-def]
    infra, write_env_toml, standin_bin, tiny_checkpoint, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    venv_bin = REPO / ".venv" / "bin"
    env = write_env_toml(
        "CI",
        python=str(venv_bin / "python"),
        nodes=1,
        gpus_per_node=1,
        time="00:15:00",
        sbatch_flags={"hold": True},
        env_vars={
            "PATH": f"{standin_bin}:{venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
        },
    )
    args = [
        "-c",
        "tiny",
        "--env-file",
        str(env),
        "-t",
        TASK,
        "deployment=vllm",
        f"run.model={tiny_checkpoint}",
        "deployment.image=vllm/vllm-openai:v0.11.0",
        "deployment.tensor_parallel_size=1",
        "evaluation.nemo_evaluator_config.config.params.limit_samples=4",
        "evaluation.nemo_evaluator_config.config.params.parallelism=4",
    ]
    started = time.monotonic()
    invocations = []
    for _ in range(2):
        submitted = cli(*args, f"deployment.port={free_port()}", "--batch", "CI")
        assert submitted.exit_code == 0, submitted.output
        invocations.append(submitted.stdout.strip().splitlines()[-1])
    records = [load_record(i) for i in invocations]
    subprocess.run(["scontrol", "release", *(str(slurm_job_id(r)) for r in records)], check=True)

    def state(invocation: str) -> str:
        return json.loads(cli("status", invocation, "--json").stdout)[0]["state"]

    for invocation in invocations:
        final = wait_for(
            lambda i=invocation: (s := state(i)) not in ("pending", "running") and s,
            timeout=900,
            interval=3,
            what="end",
        )
        assert final == "succeeded", "\n".join(cli("logs", invocation).output.splitlines()[-60:])
    took = time.monotonic() - started

    reports = [json.loads((Path(r.job_dir) / "state" / "hf_export.json").read_text()) for r in records]
    kinds = sorted((r["kind"], r["tensors_written"] > 0) for r in reports)
    assert kinds == [("exported", True), ("reused", False)], reports
    exporter, reuser = sorted(zip(reports, records, strict=True), key=lambda pair: pair[0]["kind"])
    assert reuser[0]["tensors_written"] == 0 and reuser[0]["served"] == exporter[0]["served"]
    assert reuser[0]["parity_reused"] and exporter[0]["parity"]["passed"]
    cache = f"{records[0].job_dir.split('/evaluations/')[0]}/cache/hf-exports/"
    assert exporter[0]["served"].startswith(cache)
    # they ran at once: the second waited for the first's lock (said in its job log)
    waiter_log = (Path(reuser[1].job_dir) / "logs" / "job.log").read_text()
    assert reuser[0]["waited_s"] > 0 and "another job is exporting this checkpoint" in waiter_log, waiter_log[-3000:]
    assert "0 of" in waiter_log and "tensors written" in waiter_log

    export_log = cli("logs", reuser[1].id, "--source", "export").output
    assert "export: reused: " in export_log, export_log
    scores = []
    for record in records:
        job_dir = Path(record.job_dir)
        log = (job_dir / "logs" / "job.log").read_text()
        assert log.index("exporting the checkpoint") < log.index("starting the deployment (vllm)")
        assert "identity" in log and "verified" in log  # the stand-in lists the job's identity in /v1/models
        deployment_log = (job_dir / "logs" / "deployment.log").read_text()
        assert f"loading {job_dir}/hf_export (stand-in for vLLM" in deployment_log
        shown = json.loads(cli("results", record.id, "--json").stdout)
        task = shown["tasks"][TASK]
        assert task["status"] == "succeeded" and task["n_samples"] == 4
        # results.json names what was served: the content the export step hashed, the export the engine read
        checkpoint = shown["provenance"]["checkpoint"]
        assert (checkpoint["source"], checkpoint["verified"], checkpoint["mismatch"]) == ("export step", True, [])
        assert checkpoint["files_sha256"] == exporter[0]["identity"].rpartition(":")[2]
        assert checkpoint["served_as"]["engine_reads"] == exporter[0]["served"]
        assert checkpoint["served_as"]["parity"]["passed"]
        scores.append({name: m["value"] for name, m in task["metrics"].items()})
    assert scores[0] == scores[1] and scores[0]

    # a dry run reads the cluster's cache: the export is there
    monkeypatch.setenv("COLUMNS", "300")  # the checkpoint panel's lines whole
    dry = cli(*args, f"deployment.port={free_port()}", "--run", "CI", "--dry-run", "--check")
    assert dry.exit_code == 0, dry.output
    said = " ".join(dry.output.split())
    assert "export cached: " in said and "writes 0 tensors" in said, said
    print(f"\ntwo vLLM-on-Megatron jobs, export + stand-in + {TASK}: {took:.0f} s; load {os.getloadavg()}")
