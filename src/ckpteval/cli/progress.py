"""The live progress display while a job is followed: the deployment's state and, per task, requests
answered/total, requests per second and time left (drawn from `Progress` events' snapshots). The unit is
named: a task's progress counts requests (HellaSwag sends four per document), its results count documents."""

from __future__ import annotations

import time

from ckpteval.types import JobSnapshot, TaskSnapshot


class Rates:
    """Requests per second per task, from the first and latest observation."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[float, int]] = {}

    def rate(self, task: TaskSnapshot) -> float | None:
        now = time.monotonic()
        if task.state != "running" or task.done <= 0:
            return None
        start = self.first.setdefault(task.dir, (now, task.done))
        elapsed, gained = now - start[0], task.done - start[1]
        return gained / elapsed if elapsed > 1 and gained > 0 else None


def render_progress(snapshot: JobSnapshot, rates: Rates):
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    for _ in range(5):
        table.add_column()
    dep = snapshot.deployment or "not started"
    table.add_row("[bold]deployment[/]", _color(dep), "", "", "")
    for t in snapshot.tasks:
        total = f"/{t.total}" if t.total else ""
        bar = _bar(t.done, t.total)
        count = f"{bar} {t.done}{total} requests" if t.done or t.total else ""  # a task not begun: nothing
        rate = rates.rate(t)
        eta = ""
        if rate and t.total and t.done < t.total:
            eta = f"{(t.total - t.done) / rate:,.0f} s left"
        table.add_row(f"[bold]{t.name}[/]", _color(t.state), count, f"{rate:.1f}/s" if rate else "", eta)
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
