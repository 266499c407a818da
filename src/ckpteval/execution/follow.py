"""Follow a running job: report a snapshot of its state (and its log's new lines) per tick until it ends.

Nothing here draws: the front end renders the `Progress` and `LogLines` events (the CLI as a live display).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ckpteval.execution.events import FollowEnded, LogLines, Progress, Reporter
from ckpteval.execution.snapshot import JobSnapshot, JobView, ProgressReader, take_snapshot


def watch(
    view: JobView,
    tasks: Sequence[tuple[str, str]],
    *,
    is_running: Callable[[], bool],
    report: Reporter,
    progress: ProgressReader | None = None,
    interval: float = 0.5,
    new_log_lines: Callable[[], list[str]] | None = None,
    before_snapshot: Callable[[], None] | None = None,
) -> JobSnapshot:
    """Report a `Progress` every `interval` seconds (and the job log's new lines) until the job has
    ended; return the last snapshot. `before_snapshot` runs before each (e.g. one remote prefetch)."""

    def tick() -> JobSnapshot:
        if before_snapshot is not None:
            before_snapshot()
        if new_log_lines is not None:
            lines = new_log_lines()
            if lines:
                report(LogLines(tuple(lines)))
        snapshot = take_snapshot(view, tasks, progress)
        report(Progress(snapshot))
        return snapshot

    try:
        tick()
        while is_running():
            time.sleep(interval)
            tick()
        return tick()
    finally:
        report(FollowEnded())
