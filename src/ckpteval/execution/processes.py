"""What /proc says of a process on this machine: when it started (a pid alone can be reused)."""

from __future__ import annotations

from pathlib import Path


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
