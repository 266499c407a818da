"""What an invocation cost: its GPU-hours (results.json's `usage`), and where the time went.

- **On Slurm**, from the scheduler's accounting: the allocation's elapsed time × the GPUs allocated to it
  (`sacct`'s `Elapsed` and `AllocTRES` `gres/gpu`: `cluster.slurm.job_allocation`), asked when the results are
  collected (`execution/slurm_state.py` writes it to `state/allocation.json` beside the job's other state files).
- **Here**, from the job's own clock (`state/started`, `state/ended`) × the GPUs the deployment used (the
  device the builtin server reports it loaded on: 0 on the CPU). On the CPU the GPU-hours are 0 and what the
  job used is its CPU time (`state/cpu_times`: bash's `times` at the job's end, the script's processes and
  every one it waited for) per second of wall time.

Both split the time where the job's log allows (`logs/job.log`'s stamped lines): **start-up** (from the job's
start to "deployment healthy"), **tasks** (from then to the last task's end) and **idle** (the rest: stopping
the deployment, the export; on Slurm also the allocation's start before the script's).

A deployment the job does not start is said in `deployment`: `none` (an endpoint that already runs: its GPUs
are not counted), `kept` (`evaluate watch`'s deployment, this checkpoint loaded into it in place: its GPU counts
for the job's time, its own start-up, once per watch run, for none of the invocations).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ckpteval.invocation.jobdir import JobDir

ALLOCATION_FILE = "state/allocation.json"  # sacct's view of the job's allocation (written when collected)
CPU_TIMES_FILE = "state/cpu_times"  # bash's `times` at the job's end
SACCT = "sacct"
JOB_CLOCK = "job clock"
_STAMP = re.compile(r"^\[ckpteval (\d\d):(\d\d):(\d\d)\] (.*)$")
_TIMES = re.compile(r"(?:(\d+)m)?([\d.]+)s")


@dataclass(frozen=True)
class Usage:
    """One invocation's use of its machine (see the module docstring); plain JSON values."""

    source: str  # "sacct" (the scheduler's accounting) or "job clock" (the job's own start and end)
    wall_seconds: float
    gpus: int  # allocated (Slurm) or used by the deployment (here)
    gpu_hours: float
    phases: dict[str, float] = field(default_factory=dict)  # startup, tasks, idle: seconds
    cpu_seconds: float | None = None  # here: the job's processes' user + system time
    deployment: str = "own"  # own | kept (loaded in place into the watcher's deployment) | none

    @property
    def on_cpu(self) -> bool:
        return self.gpus == 0

    @property
    def cpu_per_wall(self) -> float | None:
        if self.cpu_seconds is None or self.wall_seconds <= 0:
            return None
        return self.cpu_seconds / self.wall_seconds

    def label(self) -> str:
        """In words, short: '0.42 GPU-h (2 GPUs × 12.6 min)' or 'CPU: 96 s wall, 1.7 CPU-s/s'."""
        if self.on_cpu:
            ratio = self.cpu_per_wall
            return f"CPU: {self.wall_seconds:.0f} s wall" + (f", {ratio:.1f} CPU-s/s" if ratio is not None else "")
        gpus = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"
        return f"{self.gpu_hours:.3g} GPU-h ({gpus} × {_minutes(self.wall_seconds)})"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["cpu_per_wall"] = None if self.cpu_per_wall is None else round(self.cpu_per_wall, 3)
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> Usage:
        known = {k: data[k] for k in Usage.__dataclass_fields__ if k in data}
        return Usage(**known)


def read_usage(job_dir: Path, *, served_device: str | None, deployment_kind: str | None) -> Usage | None:
    """The usage of the job in `job_dir` (None while it has not ended, or when its clock is unreadable)."""
    allocation = _json(job_dir / ALLOCATION_FILE)
    started, ended = _time(job_dir / JobDir.STARTED), _time(job_dir / JobDir.ENDED)
    kept = "kept" if _loaded_in_place(job_dir) else ("none" if deployment_kind in (None, "none") else "own")
    phases = _phases(job_dir, started, ended)
    if allocation.get("elapsed_seconds") is not None:
        wall = float(allocation["elapsed_seconds"])
        gpus = int(allocation.get("gpus") or 0)
        if phases:  # the rest of the allocation (before the script started, after it ended) is idle too
            phases["idle"] = round(max(0.0, wall - phases["startup"] - phases["tasks"]), 3)
        return Usage(SACCT, wall, gpus, round(wall * gpus / 3600, 6), phases, deployment=kept)
    if started is None or ended is None:
        return None
    wall = max(0.0, (ended - started).total_seconds())
    gpus = 0 if kept == "none" or not served_device or served_device.startswith("cpu") else 1
    return Usage(JOB_CLOCK, wall, gpus, round(wall * gpus / 3600, 6), phases, _cpu_seconds(job_dir), deployment=kept)


def _loaded_in_place(job_dir: Path) -> bool:
    return bool(_json(job_dir / JobDir.SERVED_CHECKPOINT).get("in_place"))


def _phases(job_dir: Path, started: datetime | None, ended: datetime | None) -> dict[str, float]:
    """Start-up, tasks and idle seconds from the job log's stamps (empty when it lacks them)."""
    if started is None or ended is None:
        return {}
    try:
        lines = (job_dir / JobDir.JOB_LOG).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    healthy = last_task = None
    previous = started
    for line in lines:
        match = _STAMP.match(line)
        if not match:
            continue
        h, m, s, text = int(match[1]), int(match[2]), int(match[3]), match[4]
        stamp = previous.replace(hour=h, minute=m, second=s, microsecond=0)
        while stamp < previous - timedelta(seconds=1):  # past midnight
            stamp += timedelta(days=1)
        previous = max(previous, stamp)
        if healthy is None and text.startswith(("deployment healthy", "no deployment")):
            healthy = stamp
        elif text.endswith((": succeeded", ": failed")) or ": failed" in text:
            last_task = stamp
    if healthy is None:
        return {}
    healthy = min(max(healthy, started), ended)
    last = min(max(last_task or healthy, healthy), ended)
    total = (ended - started).total_seconds()
    startup, tasks = (healthy - started).total_seconds(), (last - healthy).total_seconds()
    return {"startup": round(startup, 3), "tasks": round(tasks, 3), "idle": round(max(0.0, total - startup - tasks), 3)}


def _cpu_seconds(job_dir: Path) -> float | None:
    """user + system seconds of the job's children (the second line of bash's `times`)."""
    try:
        lines = (job_dir / CPU_TIMES_FILE).read_text().strip().splitlines()
    except OSError:
        return None
    if len(lines) < 2:
        return None
    total = 0.0
    for minutes, seconds in _TIMES.findall(lines[1]):
        total += int(minutes or 0) * 60 + float(seconds)
    return round(total, 3)


def _time(path: Path) -> datetime | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except (OSError, ValueError):
        return None


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"
