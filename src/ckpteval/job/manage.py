"""Later commands on a recorded invocation: status, logs, cancel, results — wherever it ran.

Each function takes an `InvocationRecord` and dispatches on where the job runs: here (files and a
process group) or on Slurm (`ckpteval.cluster.manage`, over the same SSH seam as submission).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ckpteval.errors import EvaluationError
from ckpteval.job.follow import JobSnapshot, take_snapshot
from ckpteval.job.invocation import InvocationRecord
from ckpteval.results.model import InvocationResults


@dataclass(frozen=True)
class InvocationStatus:
    """An invocation's state and its tasks' states."""

    record: InvocationRecord
    state: str  # pending | running | succeeded | failed | cancelled | unknown
    snapshot: JobSnapshot | None
    detail: str = ""  # e.g. Slurm's pending reason
    slurm_job: str | None = None  # the Slurm job id (latest attempt)
    log_tail: str = ""  # the end of the job's log, when it failed


def _task_dirs(record: InvocationRecord) -> list[tuple[str, str]]:
    dirs = record.extra.get("task_dirs") or {}
    return [(name, dirs.get(name, f"tasks/{name}")) for name in record.tasks]


def process_start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc/<pid>/stat), or None if it has exited.

    Recorded with the job's pid: a pid the system reuses later belongs to a process with another start time.
    """
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 (state) on, after "pid (comm)"
    if fields[0] in ("Z", "X"):
        return None  # exited, not yet reaped by its parent: it runs no more
    return fields[19]  # field 22: starttime


def job_process_alive(record: InvocationRecord) -> bool:
    """Whether the local job's process still runs: its recorded pid is alive AND started when the job did.

    A bare pid is not enough: after the job ends (or the machine reboots) the number can be reused by an
    unrelated process, which `status` would report as running and `cancel` would signal.
    """
    pid = record.extra.get("pid")
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, someone else's: the start time decides
    now = process_start_time(int(pid))
    started = record.extra.get("pid_start")
    return now is not None and (started is None or now == started)


def _state_from(snapshot: JobSnapshot, running: bool) -> str:
    if snapshot.finished is not None:
        return {0: "succeeded", 143: "cancelled", 130: "cancelled"}.get(snapshot.finished, "failed")
    if running:
        return "running" if snapshot.deployment or any(t.state != "pending" for t in snapshot.tasks) else "pending"
    return "cancelled"  # no exit code recorded and no process: stopped from outside


def status(record: InvocationRecord) -> InvocationStatus:
    """Where the invocation stands now."""
    if record.executor == "slurm":
        from ckpteval.cluster.manage import slurm_status

        return slurm_status(record)
    from ckpteval.job.local import LocalJobView
    from ckpteval.tasks.progress import progress_reader

    view = LocalJobView(Path(record.job_dir))
    snapshot = take_snapshot(view, _task_dirs(record), progress_reader)
    return InvocationStatus(record=record, state=_state_from(snapshot, job_process_alive(record)), snapshot=snapshot)


def cancel(record: InvocationRecord) -> str:
    """Stop the invocation's job; returns what was done, for the user."""
    if record.executor == "slurm":
        from ckpteval.cluster.manage import slurm_cancel

        return slurm_cancel(record)
    if not job_process_alive(record):
        return f"invocation {record.id} is not running"
    pid = int(record.extra["pid"])
    os.killpg(pid, signal.SIGTERM)  # the job's trap stops the deployment
    for _ in range(100):
        if not job_process_alive(record):
            break
        time.sleep(0.2)
    return f"cancelled invocation {record.id} (process group {pid})"


def log_lines(record: InvocationRecord, *, follow: bool = False, source: str = "job") -> Iterator[str]:
    """The job's log (`job`), the deployment's (`deployment`) or a task client's (a task name)."""
    if record.executor == "slurm":
        from ckpteval.cluster.manage import slurm_log_lines

        yield from slurm_log_lines(record, follow=follow, source=source)
        return
    job_dir = Path(record.job_dir)
    rel = _log_path(record, source)
    path = job_dir / rel
    pos = 0
    while True:
        if path.exists():
            with path.open("r", encoding="utf-8", errors="replace") as fh:
                fh.seek(pos)
                chunk = fh.read()
                pos = fh.tell()
            yield from chunk.splitlines()
        if not follow or status(record).state not in ("running", "pending"):
            if follow and path.exists():  # drain what was written after the last read
                with path.open("r", encoding="utf-8", errors="replace") as fh:
                    fh.seek(pos)
                    yield from fh.read().splitlines()
            return
        time.sleep(0.5)


def _log_path(record: InvocationRecord, source: str) -> str:
    if source == "job":
        return "logs/job.log"
    if source == "deployment":
        return "logs/deployment.log"
    dirs = dict(_task_dirs(record))
    if source not in dirs:
        raise EvaluationError(
            f"Invocation {record.id} has no task '{source}'.",
            hint="Choose job, deployment, or one of: " + ", ".join(dirs) + ".",
        )
    repeats = int((record.extra.get("task_repeats") or {}).get(source, 0))
    if repeats and record.executor == "local":
        # a repeated task: the log of the newest repeat that has started
        from ckpteval.tasks.repeats import run_layouts

        logs = [f"{dirs[source]}/{layout.log}" for layout in run_layouts(repeats)]
        started = [rel for rel in logs if (Path(record.job_dir) / rel).exists()]
        return started[-1] if started else logs[0]
    if repeats:
        return f"{dirs[source]}/client-rs0.log"
    return f"{dirs[source]}/client.log"


def results(record: InvocationRecord) -> InvocationResults:
    """The invocation's results: results.json, collected now from the job dir if it was not written."""
    if record.executor == "slurm":
        from ckpteval.cluster.manage import slurm_results

        return slurm_results(record)
    from ckpteval.results.collect import collect_results
    from ckpteval.results.store import RESULTS_FILE, read_results

    job_dir = Path(record.job_dir)
    path = job_dir / RESULTS_FILE
    if path.exists():
        return read_results(path)
    if not job_dir.exists():
        raise EvaluationError(f"The job directory of invocation {record.id} is gone: {job_dir}.")
    return collect_results(job_dir, _task_dirs(record), invocation=record.id, created=record.created, model=None)
