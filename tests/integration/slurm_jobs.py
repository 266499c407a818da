"""Helpers for tests that submit jobs to the test cluster: a job plan with small real commands
(an HTTP server as the deployment, shell commands as task clients), submitted the way `evaluate` does it
(upload, record, nemo-run), and waiting for Slurm states."""

from __future__ import annotations

import dataclasses
import posixpath
import shlex
import socket
import subprocess
from collections.abc import Sequence
from typing import Any

from ckpteval.cluster.sbatch import SbatchSpec, tunnel_dir_for
from ckpteval.cluster.submission import upload_job_files
from ckpteval.config.profiles import Profile
from ckpteval.execution.events import silent
from ckpteval.execution.slurm import submit_job
from ckpteval.execution.slurm_state import SlurmSubmission
from ckpteval.invocation.jobdir import JobDir
from ckpteval.invocation.record import InvocationRecord, TaskEntry, new_invocation_id, now_iso
from ckpteval.job.plan import DeploymentPlan, JobPlan, Step, TaskPlan, TaskRun
from ckpteval.job.script import render_job_script
from tests.support.waiting import wait_until


def free_port() -> int:
    """A port nothing listens on now (jobs of the test cluster all run on this machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_deployment(job_dir: str, port: int, *, extra: str = "", timeout: int = 60) -> DeploymentPlan:
    """A deployment that serves `/v1/health` with python's http.server, writing its pid to deploy.pid."""
    www = posixpath.join(job_dir, "www")
    command = (
        f"mkdir -p {www}/v1 && echo ok > {www}/v1/health && echo $$ > {job_dir}/deploy.pid && {extra}"
        f"exec python3 -m http.server {port} --bind 127.0.0.1 --directory {www}"
    )
    return DeploymentPlan(
        kind="generic",
        step=Step(command=command),
        health_url=f"http://127.0.0.1:{port}/v1/health",
        readiness_timeout=timeout,
        port=port,
    )


# what the harness hook does before a client's first request (ckpteval_wait_ready), in shell
CLIENT_WAITS = (
    '[ -z "${CKPTEVAL_DEPLOYMENT_HEALTH:-}" ] || '
    'until curl -sf -o /dev/null "$CKPTEVAL_DEPLOYMENT_HEALTH"; do sleep 0.5; done; '
)


def shell_tasks(job_dir: str, commands: Sequence[tuple[str, str]], *, image: str | None = None) -> tuple[TaskPlan, ...]:
    """Task clients that are shell commands (name, command); like the real client, each waits for the
    deployment to be healthy first (the job starts the clients while the model loads)."""
    return tuple(
        TaskPlan(
            name=name,
            dir_name=name,
            endpoint_url="",
            runs=(
                TaskRun(
                    run_config={"task": name},
                    step=Step(
                        command=CLIENT_WAITS + cmd,
                        env={"TASK_NAME": name},
                        image=image,
                        mounts=(f"{job_dir}:{job_dir}",) if image else (),
                    ),
                ),
            ),
        )
        for name, cmd in commands
    )


@dataclasses.dataclass
class Submitted:
    record: InvocationRecord
    spec: SbatchSpec
    plan: JobPlan


def submit_plan(
    profile: Profile,
    make_plan: Any,
    *,
    nodes: int = 1,
    gpus_per_node: int = 8,
    extra_flags: dict[str, Any] | None = None,
    invocation: str | None = None,
    max_parallel_tasks: int = 1,
) -> Submitted:
    """Render, upload, record and submit (through nemo-run) the job `make_plan(job_dir)` returns."""

    from ckpteval.cluster.connect import connect_remote

    invocation = invocation or new_invocation_id()
    assert profile.part.remote_job_dir
    job_dir = posixpath.join(profile.part.remote_job_dir, "evaluations", invocation)
    deployment, tasks = make_plan(job_dir)
    plan = JobPlan(
        invocation=invocation,
        job_dir=job_dir,
        deployment=deployment,
        tasks=tasks,
        env={"CI_MARK": "1"},
        max_parallel_tasks=max_parallel_tasks,
    )
    files = {JobDir.SCRIPT: render_job_script(plan, launcher="srun-containers")}
    for t in tasks:
        files[f"{t.dir}/run_config.yml"] = "{}\n"
    spec = SbatchSpec(
        invocation=invocation,
        job_script=JobDir(job_dir).join(JobDir.SCRIPT),
        tunnel_dir=tunnel_dir_for(profile.part.remote_job_dir),
        account=profile.part.account,
        partition=profile.part.partition,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        time=profile.part.time,
        extra_flags=extra_flags or {},
    )
    record = InvocationRecord(
        id=invocation,
        created=now_iso(),
        mode="batch",
        profile=profile.name,
        executor="slurm",
        job_dir=job_dir,
        tasks=[TaskEntry(t.name, t.dir, t.repeats) for t in tasks],
        placement=SlurmSubmission(connection=profile.to_config(), sbatch=dataclasses.asdict(spec)),
    )
    with connect_remote(profile) as remote:
        upload_job_files(remote, job_dir, files, None)
    record.save()
    submit_job(record, spec, profile, silent)
    return Submitted(record=record, spec=spec, plan=plan)


def squeue_state(job_id: str) -> str:
    """The job's state in squeue ('' once it has left the queue)."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def wait_for(predicate: Any, *, timeout: float, interval: float = 0.3, what: str = "condition") -> Any:
    """Poll `predicate()` until it returns something truthy; fail after `timeout` seconds (`wait_until`)."""
    return wait_until(predicate, timeout=timeout, what=what, interval=interval)


def sacct_steps(job_id: str) -> list[tuple[str, str]]:
    """(step name, state) of every step of the job, from the accounting database."""
    out = subprocess.run(
        ["sacct", "-j", job_id, "-n", "-P", "-o", "JobName,State"], capture_output=True, text=True, check=False
    )
    return [tuple(line.split("|", 1)) for line in out.stdout.splitlines() if "|" in line]  # type: ignore[misc]


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this machine (all test nodes are this machine)."""
    return subprocess.run(["kill", "-0", str(pid)], capture_output=True, check=False).returncode == 0


def quote(s: str) -> str:
    return shlex.quote(s)
