"""Benchmark: GPU-time of one invocation with 3 tasks (one job, the model deployed once) against 3 one-task
invocations (3 jobs, the model deployed in each: what nemo-evaluator-launcher does, one job per task).

Against the test cluster (tests/infra/setup.sh): `evaluate -c tiny --batch`, i.e. the builtin server
serving SmolLM2-135M-Instruct (a Megatron checkpoint prepared once in the remote cache) inside the job, and
real task clients (nemo-evaluator + lm-eval, offline data) in their squashed images. Side by side in the
same run, one job at a time (the machine has 2 cores: concurrent jobs would slow each other and blur the
comparison). Accounting comes from sacct: ElapsedRaw x NNodes (node-seconds), ElapsedRaw x allocated GPUs
(gres/gpu in AllocTRES), the task steps' ElapsedRaw; the deployment's start-up is read from the job's log
(start -> healthy).

Run: uv run python benchmarks/slurm_gpu_hours.py [--limit 2] [--rounds 1]   (prints a markdown table)
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INFRA = Path("/tmp/ci-infra/infra.json")
TASKS = ("hellaswag", "gsm8k", "adlr_humaneval_greedy")
EVALUATE = str(REPO / ".venv" / "bin" / "evaluate")


@dataclass(frozen=True)
class JobUsage:
    invocation: str
    job_id: str
    tasks: tuple[str, ...]
    elapsed_s: int
    nodes: int
    gpus: int
    deploy_startup_s: float | None
    task_s: int  # the task clients' steps (sacct), summed
    state: str

    @property
    def other_s(self) -> float:
        """What is neither deployment start-up nor a task: job start, health polling, shutdown."""
        return self.elapsed_s - (self.deploy_startup_s or 0) - self.task_s

    @property
    def node_s(self) -> int:
        return self.elapsed_s * self.nodes

    @property
    def gpu_s(self) -> int:
        return self.elapsed_s * self.gpus


def free_port() -> int:
    """A port nothing listens on now (every job of the test cluster runs on this machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_env(info: dict, remote_job_dir: str) -> Path:
    venv = REPO / ".venv" / "bin"
    text = f"""[bench]
executor = "slurm"
host = "{info["ssh_host"]}"
port = {info["ssh_port"]}
user = "{info["ssh_user"]}"
identity = "{info["ssh_key"]}"
account = "{info["slurm_account"]}"
partition = "{info["slurm_partition"]}"
nodes = 1
gpus_per_node = 8
time = "01:00:00"
remote_job_dir = "{remote_job_dir}"
python = "{venv}/python"
env_vars = {{ PATH = "{venv}:/usr/local/bin:/usr/bin:/bin", HF_HUB_OFFLINE = "1", HF_DATASETS_OFFLINE = "1" }}
"""
    # not under /tmp: a long run must not lose its env.toml to a tmp cleaner
    path = Path.home() / ".cache" / "ckpteval-bench" / uuid.uuid4().hex[:10] / "env.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def submit(env: Path, tasks: tuple[str, ...], limit: int, port: int) -> str:
    argv = [
        EVALUATE,
        "-c",
        "tiny",
        "--batch",
        "bench",
        "--env-file",
        str(env),
        f"deployment.port={port}",
        f"evaluation.nemo_evaluator_config.config.params.limit_samples={limit}",
        "evaluation.nemo_evaluator_config.config.params.max_new_tokens=64",
    ]
    for task in tasks:
        argv += ["-t", task]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"submission failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def wait(invocation: str, timeout: float = 1800) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run([EVALUATE, "status", invocation, "--json"], capture_output=True, text=True, check=True)
        status = json.loads(out.stdout)[0]
        if status["state"] not in ("pending", "running"):
            return status
        time.sleep(5)
    sys.exit(f"invocation {invocation} did not finish within {timeout:.0f} s")


def usage(invocation: str, tasks: tuple[str, ...], state: str) -> JobUsage:
    from ckpteval.invocation.jobdir import JobDir
    from ckpteval.invocation.record import load_record

    record = load_record(invocation)
    job = str(record.slurm_job_id)
    for _ in range(20):  # sacct may lag the end of the job by a moment
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", job, "-o", "ElapsedRaw,NNodes,AllocTRES,State"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if out and not out.split("|")[3].startswith(("RUNNING", "COMPLETING")):
            break
        time.sleep(1)
    elapsed, nodes, tres, _ = out.split("|")
    gpus = int(m.group(1)) if (m := re.search(r"gres/gpu=(\d+)", tres)) else 0
    log = JobDir(record.job_dir).path(JobDir.JOB_LOG).read_text()  # the test cluster shares this filesystem
    stamps = {
        k: re.search(rf"\[ckpteval (\d\d:\d\d:\d\d)\] {k}", log)
        for k in ("starting the deployment", "deployment healthy")
    }
    startup = None
    if all(stamps.values()):
        t0, t1 = (datetime.strptime(m.group(1), "%H:%M:%S") for m in stamps.values())  # type: ignore[union-attr]
        startup = (t1 - t0).total_seconds()
    steps = subprocess.run(
        ["sacct", "-n", "-P", "-j", job, "-o", "JobName,ElapsedRaw"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    task_s = sum(int(line.split("|")[1]) for line in steps if line.startswith("task-"))
    return JobUsage(invocation, job, tasks, int(elapsed), int(nodes), gpus, startup, task_s, state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=2, help="samples per task")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    info = json.loads(INFRA.read_text())
    load_before = load_average()
    rows: list[tuple[str, list[JobUsage]]] = []
    for _ in range(args.rounds):
        remote_job_dir = f"{info['user_home']}/ckpteval-bench/{uuid.uuid4().hex[:10]}"
        env = write_env(info, remote_job_dir)
        # warm-up, not measured: prepares the checkpoint in the remote cache and squashes the images
        warm = submit(env, TASKS[:1], 1, free_port())
        wait(warm)
        one = submit(env, TASKS, args.limit, free_port())
        rows.append(("1 invocation, 3 tasks (ckpteval)", [usage(one, TASKS, wait(one)["state"])]))
        separate = []
        for task in TASKS:
            inv = submit(env, (task,), args.limit, free_port())
            separate.append(usage(inv, (task,), wait(inv)["state"]))
        rows.append(("3 invocations, 1 task each (one job per task, like the launcher)", separate))
    print(f"load average (1 min): {load_before} before, {load_average()} after")
    print(render(rows, args))


def load_average() -> str:
    """The 1-minute load average (the test cluster's nodes are this machine)."""
    return Path("/proc/loadavg").read_text().split()[0]


def render(rows: list[tuple[str, list[JobUsage]]], args: argparse.Namespace) -> str:
    lines = [
        f"tasks: {', '.join(TASKS)}; limit_samples={args.limit}; 1 node x 8 (fake) GPUs per job",
        "",
        "| setup | jobs (states) | deployments | deployment start-up (s) | task steps (s) | other (s) "
        "| elapsed (s) | node-s | GPU-s | GPU-h |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, jobs in rows:
        startup = [j.deploy_startup_s or 0.0 for j in jobs]
        gpu_s = sum(j.gpu_s for j in jobs)
        lines.append(
            f"| {name} | {len(jobs)} ({', '.join(sorted({j.state for j in jobs}))}) | {len(jobs)} | "
            f"{' + '.join(f'{s:.0f}' for s in startup)} | {' + '.join(str(j.task_s) for j in jobs)} | "
            f"{' + '.join(f'{j.other_s:.0f}' for j in jobs)} | {' + '.join(str(j.elapsed_s) for j in jobs)} | "
            f"{sum(j.node_s for j in jobs)} | {gpu_s} | {gpu_s / 3600:.3f} |"
        )
    if len(rows) >= 2:
        one, per_task = rows[0][1], rows[1][1]
        ours, theirs = sum(j.gpu_s for j in one), sum(j.gpu_s for j in per_task)
        lines += ["", f"measured GPU-time ratio, one job / one job per task: {ours / theirs:.2f}"]
        # the same jobs with a longer start-up, as a large checkpoint on real GPUs has (an extrapolation)
        tasks = sum(j.task_s for j in per_task) / len(TASKS)
        other = sum(j.other_s for j in per_task) / len(per_task)
        for startup in (120, 300, 900):
            a = startup + len(TASKS) * tasks + other
            b = len(TASKS) * (startup + tasks + other)
            lines.append(f"- with a {startup} s deployment start-up (same tasks): ratio {a / b:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
