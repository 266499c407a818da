"""The typed invocation record: one builder for every backend, the executor's part its own (a typed payload),
old records still readable, damage said plainly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ckpteval.config.compose import CompileRequest
from ckpteval.config.secrets import REDACTED, SecretValues
from ckpteval.errors import ConfigError
from ckpteval.execution.local import LocalProcess, process_of
from ckpteval.execution.slurm_state import SlurmSubmission, slurm_job_id, submission_of
from ckpteval.invocation.record import (
    InvocationRecord,
    TaskEntry,
    command_line,
    list_records,
    load_record,
    records_dir,
)

SECRET = "hf_0123456789abcdef"


@dataclasses.dataclass
class Pod:
    """A third executor's part of a record (its own dataclass)."""

    name: str
    namespace: str


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
    slurm = submission_of(record)
    assert slurm.job_ids == ["42", "43"] and slurm_job_id(record) == "43"
    assert slurm.connection["host"] == "127.0.0.1" and (slurm.nemo_run_dir or "").endswith("/x")
    assert (record.model, record.label) == ("/ckpt", "sft-7")
    assert record.final is not None and record.final.tasks[0].done == 5
    local = load_record("5e6f")
    assert process_of(local) == LocalProcess(7, "99") and local.placement_as(SlurmSubmission) is None
    assert local.local_results_dir == local.job_dir  # where its files are on this machine
    # saved again, it is in the typed format and reads back equal
    record.save()
    assert json.loads((record.path / "record.json").read_text())["version"] == 3
    again = load_record(record.id)
    assert submission_of(again) == slurm and dataclasses.replace(again, placement=slurm) == record


def test_a_version_2_record_keeps_its_executor_part_as_the_placement(isolated_user: Path):
    """Version 2 kept the Slurm submission under `slurm` and the local process under `process`."""
    base = {k: v for k, v in V1_SLURM.items() if k not in ("extra", "slurm_job_id", "nemo_run_experiment")}
    tasks = [{"name": "gsm8k", "dir": "tasks/gsm8k", "repeats": 0}]
    slurm = {"connection": {"host": "h"}, "sbatch": {}, "job_ids": ["7"]}
    _write("2a2a2a2a", {**base, "id": "2a2a2a2a", "version": 2, "tasks": tasks, "slurm": slurm, "process": None})
    _write(
        "2b2b2b2b",
        {
            **base,
            "id": "2b2b2b2b",
            "version": 2,
            "tasks": tasks,
            "executor": "local",
            "slurm": None,
            "process": {"pid": 5, "start": "1"},
        },
    )
    assert slurm_job_id(load_record("2a2a")) == "7"
    assert process_of(load_record("2b2b")) == LocalProcess(5, "1")


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
        placement=SlurmSubmission(connection={"host": "h"}, sbatch={"nodes": 1}, job_ids=["9"]),
    )
    record.save()
    again = load_record("0c0c")
    assert again.placement == dataclasses.asdict(record.placement)  # JSON until its backend types it
    assert submission_of(again) == record.placement and again == record
    assert record.where == "slurm:CI"


def test_where_names_the_executor_and_profile_of_any_executor(isolated_user: Path):
    """A third executor's record is not shown as local (as one without a Slurm submission once was)."""
    record = InvocationRecord(
        id="0d0d0d0d",
        created="2026-11-24T00:00:00Z",
        mode="batch",
        profile="gpu-box",
        executor="ssh",
        job_dir="/x/0d0d0d0d",
        tasks=[],
        placement=Pod(name="eval-0d0d", namespace="ml"),
    )
    assert record.where == "ssh:gpu-box"
    assert dataclasses.replace(record, profile="local", executor="local").where == "local"
    record.save()
    again = load_record("0d0d")
    assert again.placement_as(SlurmSubmission) is None and again.placement_as(Pod) == record.placement


def test_the_command_line_is_redacted_by_value_for_either_backend():
    secrets = SecretValues()
    secrets.add(SECRET)
    request = CompileRequest(
        configs=("sft",), profile="CI", mode="batch", tasks=("gsm8k:4",), overrides=(f"run.env.HF_TOKEN={SECRET}",)
    )
    words = command_line(request, secrets.redact)
    assert words == ["evaluate", "-c", "sft", "--batch", "CI", "-t", "gsm8k:4", f"run.env.HF_TOKEN={REDACTED}"]
    assert SECRET not in " ".join(words)
