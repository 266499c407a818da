"""The typed invocation record: one builder for both backends, old records still readable, damage said plainly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpteval.config.compose import CompileRequest
from ckpteval.config.secrets import REDACTED, SecretValues
from ckpteval.errors import ConfigError
from ckpteval.invocation.record import (
    InvocationRecord,
    LocalProcess,
    SlurmSubmission,
    TaskEntry,
    command_line,
    list_records,
    load_record,
    records_dir,
)

SECRET = "hf_0123456789abcdef"

# a record as round 1 wrote it: core fields under an untyped `extra`
V1_SLURM = {
    "id": "1a2b3c4d",
    "created": "2026-11-20T10:00:00Z",
    "mode": "batch",
    "profile": "CI",
    "executor": "slurm",
    "job_dir": "/lustre/evals/1a2b3c4d",
    "tasks": ["adlr_mmlu", "gsm8k"],
    "command_line": ["evaluate", "-c", "sft"],
    "env_file": None,
    "slurm_job_id": "43",
    "nemo_run_experiment": "ckpteval_1",
    "local_results_dir": None,
    "extra": {
        "task_dirs": {"adlr_mmlu": "tasks/adlr_mmlu", "gsm8k": "tasks/gsm8k"},
        "task_repeats": {"gsm8k": 4},
        "connection": {"name": "CI", "host": "127.0.0.1"},
        "sbatch": {"invocation": "1a2b3c4d", "job_script": "/lustre/evals/1a2b3c4d/job.sh"},
        "model": "/ckpt",
        "label": "sft-7",
        "slurm_job_ids": ["42", "43"],
        "nemo_run_dir": "/home/u/.nemo_run/experiments/x",
        "final": {
            "job": "43",
            "state": "succeeded",
            "detail": "",
            "log_tail": "",
            "deployment": "stopped",
            "finished": 0,
            "tasks": [{"name": "adlr_mmlu", "dir": "tasks/adlr_mmlu", "state": "succeeded", "done": 5, "total": 5}],
        },
    },
}


def _write(record_id: str, data: object) -> None:
    path = records_dir() / record_id / "record.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))


def test_a_record_written_before_the_typed_format_is_read_and_converted(isolated_user: Path):
    _write("1a2b3c4d", V1_SLURM)
    _write("5e6f7a8b", {**V1_SLURM, "id": "5e6f7a8b", "executor": "local", "extra": {"pid": 7, "pid_start": "99"}})
    record = load_record("1a2b")
    assert record.tasks == [TaskEntry("adlr_mmlu", "tasks/adlr_mmlu", 0), TaskEntry("gsm8k", "tasks/gsm8k", 4)]
    assert record.slurm is not None and record.slurm.job_ids == ["42", "43"] and record.slurm_job_id == "43"
    assert record.slurm.connection["host"] == "127.0.0.1" and record.slurm.nemo_run_dir.endswith("/x")
    assert (record.model, record.label) == ("/ckpt", "sft-7")
    assert record.final is not None and record.final.tasks[0].done == 5
    local = load_record("5e6f")
    assert local.process == LocalProcess(7, "99") and local.slurm is None
    assert local.local_results_dir == local.job_dir  # where its files are on this machine
    # saved again, it is in the typed format and reads back equal
    record.save()
    assert json.loads((record.path / "record.json").read_text())["version"] == 2
    assert load_record(record.id) == record


def test_a_damaged_record_is_one_clear_error_and_is_left_out_of_the_listing(isolated_user: Path):
    _write("deadbeef", {"id": "deadbeef", "version": 2, "tasks": "oops"})
    with pytest.raises(ConfigError) as err:
        load_record("deadbeef")
    assert "record" in err.value.message and "deadbeef" in err.value.message and err.value.hint
    assert list_records() == []


def test_the_typed_record_round_trips(isolated_user: Path):
    record = InvocationRecord(
        id="0c0c0c0c",
        created="2026-11-24T00:00:00Z",
        mode="run",
        profile="CI",
        executor="slurm",
        job_dir="/x/0c0c0c0c",
        tasks=[TaskEntry("gsm8k", "tasks/gsm8k", 2)],
        slurm=SlurmSubmission(connection={"host": "h"}, sbatch={"nodes": 1}, job_ids=["9"]),
    )
    record.save()
    assert load_record("0c0c") == record
    assert record.where == "slurm:CI"


def test_the_command_line_is_redacted_by_value_for_either_backend():
    secrets = SecretValues()
    secrets.add(SECRET)
    request = CompileRequest(
        configs=("sft",), profile="CI", mode="batch", tasks=("gsm8k:4",), overrides=(f"run.env.HF_TOKEN={SECRET}",)
    )
    words = command_line(request, secrets.redact)
    assert words == ["evaluate", "-c", "sft", "--batch", "CI", "-t", "gsm8k:4", f"run.env.HF_TOKEN={REDACTED}"]
    assert SECRET not in " ".join(words)
