"""Follow a running job: read its state files (here or over SSH) and draw progress until it ends.

The job writes small state files (`state/*`, `tasks/<dir>/state`) and the harness writes its progress
into each task's output dir; a `JobView` reads them, wherever the job runs. The display shows the
deployment's state and, per task, samples done/total, samples per second and time left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console


class JobView(Protocol):
    """Read-only access to a job directory (local files, or SFTP on a cluster)."""

    def read_text(self, rel: str) -> str | None:
        """The file's text, or None when it does not exist (yet)."""
        ...


@dataclass(frozen=True)
class TaskSnapshot:
    name: str
    dir: str
    state: str  # pending | running | succeeded | failed N | skipped
    done: int = 0
    total: int | None = None
    error: str = ""  # a failed task: why (one line from its client log), the log (relative), what to do
    log: str = ""
    hint: str = ""


@dataclass(frozen=True)
class JobSnapshot:
    deployment: str  # starting | ready | failed | none | "" (not started)
    tasks: tuple[TaskSnapshot, ...]
    finished: int | None  # the job's exit code once it has ended

    @property
    def succeeded(self) -> bool:
        return self.finished == 0


ProgressReader = Callable[[JobView, str], tuple[int, int | None]]


def take_snapshot(view: JobView, tasks: Sequence[tuple[str, str]], progress: ProgressReader | None) -> JobSnapshot:
    """The job's state now. `tasks` is (name, dir) in run order."""
    finished_text = view.read_text("state/finished")
    finished = int(finished_text.strip()) if finished_text and finished_text.strip().lstrip("-").isdigit() else None
    deployment = (view.read_text("state/deployment") or "").strip()
    snaps = []
    for name, task_dir in tasks:
        state = (view.read_text(f"{task_dir}/state") or "").strip() or "pending"
        if state == "pending" and view.read_text(f"{task_dir}/.done") is not None:
            state = "succeeded"
        done, total = (0, None)
        if progress is not None and state != "pending":
            done, total = progress(view, task_dir)
        why = _failure(view, task_dir) if state.startswith("failed") else {}
        snaps.append(TaskSnapshot(name=name, dir=task_dir, state=state, done=done, total=total, **why))
    return JobSnapshot(deployment=deployment, tasks=tuple(snaps), finished=finished)


def _failure(view: JobView, task_dir: str) -> dict[str, str]:
    """Why a failed task failed, from its client log (a repeated task's logs are per repeat: see results)."""
    from ckpteval.tasks.failure import explain_log

    log = f"{task_dir}/client.log"
    text = view.read_text(log)
    if text is None:
        return {}
    why = explain_log(text, log=log)
    return {"error": why.reason, "log": why.log, "hint": why.hint or ""}


def follow(
    view: JobView,
    tasks: Sequence[tuple[str, str]],
    *,
    is_running: Callable[[], bool],
    progress: ProgressReader | None = None,
    interval: float = 0.5,
    quiet: bool = False,
    on_tick: Callable[[Console], None] | None = None,
    console: Console | None = None,
) -> JobSnapshot:
    """Redraw progress every `interval` seconds until the job has ended; return the last snapshot.

    `on_tick(console)` runs right before each snapshot (and once at the end): what it prints (e.g. new
    lines of the job's log) appears above the progress display, and it may refresh the view's data.
    """
    from rich.console import Console
    from rich.live import Live

    console = console or Console(stderr=True)
    tick = on_tick or (lambda _c: None)
    rates = _Rates()
    if quiet or not console.is_terminal:
        while is_running():
            tick(console)
            time.sleep(interval)
        tick(console)
        return take_snapshot(view, tasks, progress)
    tick(console)
    snapshot = take_snapshot(view, tasks, progress)
    with Live(_render(snapshot, rates), console=console, refresh_per_second=4, transient=False) as live:
        while is_running():
            time.sleep(interval)
            tick(live.console)
            snapshot = take_snapshot(view, tasks, progress)
            live.update(_render(snapshot, rates))
        tick(live.console)
        snapshot = take_snapshot(view, tasks, progress)
        live.update(_render(snapshot, rates))
    return snapshot


class _Rates:
    """Samples per second per task, from the first and latest observation."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[float, int]] = {}

    def rate(self, task: TaskSnapshot) -> float | None:
        now = time.monotonic()
        if task.state != "running" or task.done <= 0:
            return None
        start = self.first.setdefault(task.dir, (now, task.done))
        elapsed, gained = now - start[0], task.done - start[1]
        return gained / elapsed if elapsed > 1 and gained > 0 else None


def _render(snapshot: JobSnapshot, rates: _Rates):
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    for _ in range(5):
        table.add_column()
    dep = snapshot.deployment or "not started"
    table.add_row("[bold]deployment[/]", _color(dep), "", "", "")
    for t in snapshot.tasks:
        total = f"/{t.total}" if t.total else ""
        bar = _bar(t.done, t.total)
        rate = rates.rate(t)
        eta = ""
        if rate and t.total and t.done < t.total:
            eta = f"{(t.total - t.done) / rate:,.0f} s left"
        table.add_row(
            f"[bold]{t.name}[/]", _color(t.state), f"{bar} {t.done}{total}", f"{rate:.1f}/s" if rate else "", eta
        )
    return table


def _bar(done: int, total: int | None, width: int = 20) -> str:
    if not total:
        return ""
    filled = min(width, int(width * done / total))
    return "[green]" + "█" * filled + "[/][dim]" + "░" * (width - filled) + "[/]"


def _color(state: str) -> str:
    if state.startswith("failed"):
        return f"[red]{state}[/]"
    return {
        "succeeded": "[green]succeeded[/]",
        "ready": "[green]ready[/]",
        "running": "[yellow]running[/]",
        "starting": "[yellow]starting[/]",
    }.get(state, f"[dim]{state}[/]")
