"""A judged task on the real test cluster: `evaluate --batch CI -c tiny -t adlr_humaneval_greedy,mtbench
judge=builtin ...` deploys the model and, on a node of its own in the same allocation, the judge (SmolLM2 as
both), runs one HumanEval problem, is cancelled, is resumed, and runs one MT-Bench question against them. Two
deployments in `status` and `logs`, both stopped by `cancel` (steps and processes gone), both started again
by `resume`, which sends nothing for the finished task; the allocation sized for both, the judge's step on a
node of its own, reached at its name; every request counted at each server's access log. Needs the `judge`
extra (MT-Bench's harness).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpteval.execution.slurm_state import slurm_job_id
from ckpteval.invocation.record import load_record
from tests.integration.slurm_jobs import free_port, sacct_steps, wait_for
from tests.integration.test_slurm_evaluate import cli, job_profile  # noqa: F401  (a fixture)

pytest.importorskip("core_evals.mtbench")
# 7 min 17 s at load 7-26, cancel and resume included (two SmolLM2 servers on CPU, started twice, one HumanEval
# problem, one MT-Bench question and its judgments; ~20 min before at load ~25): the long tier, like
# tests/e2e/tasks/test_judged.py
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(3600)]

PARAMS = "evaluation.nemo_evaluator_config.config.params"


@pytest.fixture(scope="module")
def smollm2_checkpoint(infra) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """SmolLM2 as a Megatron checkpoint where the CI user's jobs can read it (a copy of the cached one)."""
    from tests.e2e.conftest import packaged_checkpoint

    tests_dir = Path(infra.user_home) / "ckpteval-tests"
    tests_dir.mkdir(exist_ok=True)
    shutil.chown(tests_dir, user=infra.ssh_user)
    path = tests_dir / f"smollm2-{uuid.uuid4().hex[:8]}"
    shutil.copytree(packaged_checkpoint("smol"), path)
    subprocess.run(["chmod", "-R", "a+rX", str(path)], check=True)
    yield str(path)
    shutil.rmtree(path, ignore_errors=True)


def _posts(log: str, route: str) -> int:
    """POSTs a builtin server answered on `route` (the harnesses add a slash: `/v1/completions/`), from its
    access log (`access_log: true`)."""
    return len(re.findall(f'"POST {re.escape(route)}/? HTTP', log))


def _servers_of(identity: str) -> str:
    """The processes on the cluster's nodes (this machine) serving with `identity`: none once stopped."""
    return subprocess.run(["pgrep", "-af", "--", f"--identity {identity}"], capture_output=True, text=True).stdout


def test_a_judge_runs_on_a_node_of_its_own_in_the_same_allocation(
    job_profile,  # noqa: F811
    infra,
    smollm2_checkpoint: str,
) -> None:  # type: ignore[no-untyped-def]
    """Submitted, cancelled once the first task has finished (both deployments ready), resumed to the end:
    two deployments in `status` and `logs`, both stopped by `cancel`, both started again by `resume`, which
    sends nothing for the finished task; every judge request is counted at the judge, none at the model."""
    began = time.monotonic()
    env = job_profile(nodes=1, time="00:40:00")  # the job asks for the two nodes its two deployments need
    argv = [
        *("-c", "tiny", "--env-file", str(env), "-t", "adlr_humaneval_greedy,mtbench", "--batch", "CI"),
        *(f"run.model={smollm2_checkpoint}", f"deployment.port={free_port()}"),
        *("judge=builtin", f"judge.checkpoint_path={smollm2_checkpoint}", f"judge.port={free_port()}"),
        *("deployment.access_log=true", "judge.access_log=true", "evaluation.max_parallel_tasks=1"),
        *(f"{PARAMS}.limit_samples=1", f"{PARAMS}.max_new_tokens=8", f"{PARAMS}.parallelism=1"),
        *("judge.max_error_rate=1.0", f"+{PARAMS}.extra.judge.max_tokens=16"),
    ]
    shown = cli(*argv, "--dry-run")
    assert shown.exit_code == 0, shown.output
    assert "a second server on node 2 of the allocation" in shown.output
    submitted = cli(*argv)
    assert submitted.exit_code == 0, submitted.output
    invocation = submitted.stdout.strip().splitlines()[-1]
    record = load_record(invocation)
    first_job = str(slurm_job_id(record))
    job_dir = Path(record.job_dir)

    def status() -> dict:  # type: ignore[type-arg]
        return json.loads(cli("status", invocation, "--json").stdout)[0]

    def tasks() -> dict[str, str]:
        return {t["name"]: t["state"] for t in status()["tasks"]}

    # both deployments ready, the first task done: then cancel
    wait_for(
        lambda: (
            status()["deployments"] == {"model": "ready", "judge": "ready"}
            and tasks().get("adlr_humaneval_greedy") == "succeeded"
        ),
        timeout=1500,
        interval=5,
        what="both deployments ready and the first task done",
    )
    shown_status = cli("status", invocation).output
    assert "judge" in shown_status and "deployment" in shown_status
    assert "Serving 'judge'" in cli("logs", invocation, "-s", "judge").output  # each role's own log
    assert "Serving 'smollm2" in cli("logs", invocation, "-s", "deployment").output
    identities = {r: (job_dir / "state" / f"{r}_identity").read_text().strip() for r in ("deployment", "judge")}
    assert all(_servers_of(i) for i in identities.values())
    cancelled = cli("cancel", invocation)
    assert cancelled.stdout.startswith(f"cancelled invocation {invocation}"), cancelled.output
    wait_for(
        lambda: status()["deployments"] == {"model": "cancelled", "judge": "cancelled"},
        timeout=120,
        what="both deployments cancelled in status",
    )
    # both steps gone, both servers' processes with them
    wait_for(
        lambda: not subprocess.run(["squeue", "-h", "-j", first_job], capture_output=True, text=True).stdout.strip(),
        timeout=120,
        what="the job to leave the queue",
    )
    assert all(state != "RUNNING" for _, state in sacct_steps(first_job))
    wait_for(lambda: not any(_servers_of(i) for i in identities.values()), timeout=60, what="both servers to end")
    first = {r: (job_dir / "logs" / f"{r}.log").read_text(errors="replace") for r in identities}
    # the finished task's requests reached the model
    assert _posts(first["deployment"], "/v1/completions") >= 1, first["deployment"][-6000:]
    assert _posts(first["judge"], "/v1/completions") == 0

    resumed = cli("resume", invocation)
    assert resumed.exit_code == 0, resumed.output
    record = load_record(invocation)
    job = str(slurm_job_id(record))
    assert job != first_job
    final = wait_for(
        lambda: (s := status()["state"]) not in ("pending", "running") and s, timeout=2100, interval=5, what="end"
    )
    log = cli("logs", invocation).output
    assert final == "succeeded", log[-4000:] + cli("logs", invocation, "-s", "mtbench").output[-4000:]
    assert status()["deployments"] == {"model": "stopped", "judge": "stopped"}
    assert "task adlr_humaneval_greedy: already done, skipped" in log
    assert log.count("judge healthy") == 2 and log.count("deployment healthy") == 2  # both, in both jobs

    # the allocation holds both deployments' nodes; the judge's step ran on the second
    alloc = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "NNodes"], capture_output=True, text=True)
    assert alloc.stdout.strip() == "2"
    steps = dict(sacct_steps(job))
    assert "deployment" in steps and "judge" in steps
    placed = subprocess.run(
        ["sacct", "-n", "-P", "-j", job, "-o", "JobName,NodeList"], capture_output=True, text=True
    ).stdout.splitlines()
    nodes = dict(line.split("|", 1) for line in placed if "|" in line)
    assert nodes["judge"] != nodes["deployment"]
    assert "the judge runs on its own node(s) from" in log

    # counted at each server, over both jobs: the resumed one sent nothing for the finished task; the model
    # answered MT-Bench's two turns (one more at most, had the cancel cut a request short) and no judgment;
    # the judge the harness's check and every judgment, and no task's request
    second = {r: (job_dir / "logs" / f"{r}.log").read_text(errors="replace") for r in identities}
    assert _posts(second["deployment"], "/v1/completions") == 0
    judgments = (job_dir / "tasks" / "mtbench" / "output").rglob("judgements/*_single.jsonl")
    rows = [json.loads(line) for path in judgments for line in path.read_text().splitlines() if line.strip()]
    assert len(rows) == 2
    chat = "/v1/chat/completions"
    at_model = _posts(first["deployment"], chat) + _posts(second["deployment"], chat)
    at_judge = _posts(first["judge"], chat) + _posts(second["judge"], chat)
    assert 2 <= at_model <= 3, (at_model, at_judge)
    assert at_judge >= 1 + len(rows), (at_model, at_judge)
    assert _posts(second["judge"], "/v1/completions") == 0
    print(f"\nSlurm judge lifecycle: {time.monotonic() - began:.0f} s, load {os.getloadavg()[0]:.1f}")
