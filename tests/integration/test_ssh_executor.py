"""`executor = "ssh"`: a machine reached over SSH with no scheduler (the test cluster's sshd, as the CI user),
end to end with the tiny checkpoint: an attached `--run` and a detached `--batch` at once, each on a GPU of its
own (locked there per GPU), a third refused with why; status, logs, cancel and resume from other processes
(other shells); the job is a real process of the remote user, detached from the SSH session that started it.

Every `evaluate` here is its own process (`python -m ckpteval.cli`), as a user's shells would be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpteval.config.profiles import toml_value
from ckpteval.execution.ssh import SshPlacement
from ckpteval.invocation.record import load_record
from tests.integration.conftest import REPO
from tests.integration.slurm_jobs import free_port, wait_for

pytestmark = pytest.mark.slurm


@pytest.fixture
def workstation(infra, remote_job_dir: str, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    """An env.toml whose profile WS is the test sshd as an SSH workstation with 2 GPUs, running this venv."""
    venv_bin = REPO / ".venv" / "bin"
    values = {
        "executor": "ssh",
        "host": infra.ssh_host,
        "port": infra.ssh_port,
        "user": infra.ssh_user,
        "identity": infra.ssh_key,
        "remote_job_dir": remote_job_dir,
        "python": str(venv_bin / "python"),
        "gpus_per_node": 2,
        "env_vars": {
            "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
        },
    }
    path = tmp_path / "env.toml"
    path.write_text("[WS]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items()))
    return path


def tiny(env: Path, mode: str) -> list[str]:
    """The tiny checkpoint, prepared in the job, on 3 HumanEval problems (as the Slurm test runs it)."""
    return [
        "-c",
        "tiny",
        mode,
        "WS",
        "--env-file",
        str(env),
        "-t",
        "adlr_humaneval_greedy",
        "deployment.prepare=tiny",
        "run.model=${execution.cache_dir}/checkpoints/tiny",
        f"deployment.port={free_port()}",
        "evaluation.nemo_evaluator_config.config.params.limit_samples=3",
        "evaluation.nemo_evaluator_config.config.params.max_new_tokens=32",
    ]


def evaluate(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`evaluate ARGV` in a process of its own (another shell)."""
    done = subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", *argv], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def state(invocation: str) -> str:
    return str(json.loads(evaluate("status", invocation, "--json").stdout)[0]["state"])


def remote_user(pid: int) -> str:
    return subprocess.run(["ps", "-o", "user=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()


@pytest.mark.slow
def test_two_invocations_at_once_with_status_logs_cancel_resume_from_other_shells(workstation: Path, infra):  # type: ignore[no-untyped-def]
    began = time.monotonic()
    # attached: follows the job to its end, in a process of its own
    attached = subprocess.Popen(
        [sys.executable, "-m", "ckpteval.cli", *tiny(workstation, "--run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # detached, beside it: submitted, and left running
        submitted = evaluate(*tiny(workstation, "--batch"))
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        batch = submitted.stdout.strip().splitlines()[-1]
        record = load_record(batch)
        placement = record.placement_as(SshPlacement)
        assert placement is not None and placement.pid and record.where == "ssh:WS"
        # a real process of the remote user, not a child of the command that started it (which has ended)
        assert remote_user(placement.pid) == infra.ssh_user
        assert os.getppid() != placement.pid

        # the attached one has its GPU too: each has one of the two, never the same
        def attached_record():  # type: ignore[no-untyped-def]
            from ckpteval.invocation.record import list_records

            others = [r for r in list_records() if r.id != batch and r.executor == "ssh"]
            found = others[0].placement_as(SshPlacement) if others else None
            return (others[0], found) if found is not None and found.pid else None

        running, running_placement = wait_for(attached_record, timeout=120, what="the attached job to start")
        assert {placement.gpus, running_placement.gpus} == {"0", "1"}

        # a third finds no free GPU: refused with why, before it runs anything
        third = evaluate(*tiny(workstation, "--batch"))
        assert third.returncode != 0
        refusal = " ".join(third.stderr.split())
        assert "did not start" in refusal and "1 GPU(s) wanted, 0 of 2 free" in refusal, third.stderr
        assert batch in refusal and running.id in refusal  # which invocations hold them

        # from other shells: status, logs, cancel; then resume
        wait_for(lambda: state(batch) == "running", timeout=60, what="running")
        status = json.loads(evaluate("status", batch, "--json").stdout)[0]
        assert status["pid"] == str(placement.pid) and status["gpus"] == placement.gpus
        wait_for(lambda: "starting the deployment" in evaluate("logs", batch).stdout, timeout=120, what="a log")
        cancelled = evaluate("cancel", batch)
        assert cancelled.stdout.startswith(f"cancelled invocation {batch}"), cancelled.stdout + cancelled.stderr
        assert state(batch) == "cancelled" and remote_user(placement.pid) == ""  # its processes are gone
        resumed = evaluate("resume", batch)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        again = load_record(batch).placement_as(SshPlacement)
        assert again is not None and again.pid != placement.pid and again.gpus == placement.gpus  # its GPU, free again

        out, _ = attached.communicate(timeout=600)
        assert attached.returncode == 0, out[-4000:]
        assert "adlr_humaneval_greedy" in out and "pass_at_1" in out  # the score table, as it followed to the end
        final = wait_for(lambda: (s := state(batch)) not in ("pending", "running") and s, timeout=600, what="end")
        assert final == "succeeded", evaluate("logs", batch).stdout[-4000:]
        results = json.loads(evaluate("results", batch, "--json").stdout)
        task = results["tasks"]["adlr_humaneval_greedy"]
        assert task["status"] == "succeeded" and task["n_samples"] == 3
    finally:
        attached.kill()
        for record in _ssh_records():
            evaluate("cancel", record)
    print(f"\nssh executor test: {time.monotonic() - began:.0f} s, load {os.getloadavg()[0]:.1f}")


def _ssh_records() -> list[str]:
    from ckpteval.invocation.record import list_records

    return [r.id for r in list_records() if r.executor == "ssh"]
