"""`evaluate watch` on an `executor = "ssh"` profile (a GPU workstation, no scheduler: the test sshd as the CI
user): the save dir there is listed over SSH, the ready checkpoint is evaluated there by a detached job of the
ssh executor, the half-written one is left waiting, and `--once` exits when the evaluation has ended, its score in
the watch run's state. One checkpoint (the tiny one), three HumanEval problems."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpteval.execution.ssh import SshPlacement
from ckpteval.invocation.record import load_record
from tests.integration.slurm_jobs import free_port
from tests.integration.test_ssh_executor import workstation  # noqa: F401 (the fixture: the WS profile)
from tests.integration.test_watch_ssh import _write_saves

pytestmark = pytest.mark.slurm


@pytest.mark.slow
def test_watch_once_evaluates_a_ready_checkpoint_on_the_workstation(
    workstation: Path,  # noqa: F811
    infra,  # type: ignore[no-untyped-def]
    remote_job_dir: str,
    tiny_checkpoint: str,
) -> None:
    began = time.monotonic()
    save_dir = Path(remote_job_dir) / "run7" / "checkpoints"
    _write_saves(save_dir, infra, complete=[100], half=[200], like=Path(tiny_checkpoint))
    params = "evaluation.nemo_evaluator_config.config.params"
    argv = [sys.executable, "-m", "ckpteval.cli", "watch", str(save_dir), "-c", "tiny", "--run", "WS"]
    argv += ["--env-file", str(workstation), "-t", "adlr_humaneval_greedy", "--once", "--every", "2"]
    argv += [f"deployment.port={free_port()}", f"{params}.limit_samples=3", f"{params}.max_new_tokens=32"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)

    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout[-4000:] + done.stderr[-4000:]
    from ckpteval.watch.state import load_state, run_name

    state = load_state(run_name(str(save_dir), "WS"))
    assert state is not None
    entry = state.iterations[100]
    assert entry.state == "succeeded", done.stdout[-4000:]
    record = load_record(entry.attempts[-1].invocation)
    assert record.executor == "ssh" and record.placement_as(SshPlacement) is not None  # run by the ssh executor
    assert record.watch is not None and record.watch.iteration == 100
    assert f"iter_{100:07d}" in " ".join(record.command_line)
    assert state.iterations.get(200) is None or state.iterations[200].state == "waiting"  # half-written: not yet
    results = subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", "results", record.id, "--json"], capture_output=True, text=True
    )
    task = json.loads(results.stdout)["tasks"]["adlr_humaneval_greedy"]
    assert task["status"] == "succeeded" and task["n_samples"] == 3
    print(f"\nwatch over ssh: {time.monotonic() - began:.0f} s, load {os.getloadavg()[0]:.1f}")


def test_inspect_reads_the_checkpoint_on_the_workstation_over_ssh(
    workstation: Path,  # noqa: F811
    infra,  # type: ignore[no-untyped-def]
    remote_job_dir: str,
    tiny_checkpoint: str,
) -> None:
    """`evaluate inspect PATH --run WS`: read through the profile's executor, where its jobs run (its small
    files over SSH, one round trip)."""
    save_dir = Path(remote_job_dir) / "run8" / "checkpoints"
    _write_saves(save_dir, infra, complete=[100], half=[], like=Path(tiny_checkpoint))
    argv = [sys.executable, "-m", "ckpteval.cli", "inspect", str(save_dir), "--run", "WS", "--env-file"]
    shown = subprocess.run([*argv, str(workstation)], capture_output=True, text=True, timeout=300, check=False)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stdout + shown.stderr
    assert "100" in shown.stdout and "torch_dist" in shown.stdout
