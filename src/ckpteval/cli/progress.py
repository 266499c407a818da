"""The live progress display while a job is followed: the deployment's state and, per task, documents
done/total (the unit its results' n counts) with the requests sent for them as detail, requests per second
and time left (drawn from `Progress` events' snapshots). A harness that does not say how many documents are
done (not lm-eval) shows requests alone, named as such."""

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
        count = count_text(t)
        if count:  # a task not begun: nothing
            bar = _bar(t.docs, t.docs_total) if t.docs is not None else _bar(t.done, t.total)
            count = f"{bar} {count}" if bar else count
        rate = rates.rate(t)
        eta = ""
        if rate and t.total and t.done < t.total:
            eta = f"{(t.total - t.done) / rate:,.0f} s left"
        table.add_row(f"[bold]{t.name}[/]", _color(t.state), count, f"{rate:.1f} req/s" if rate else "", eta)
    return table


def count_text(t: TaskSnapshot) -> str:
    """A task's progress in words: "2/2 docs · 8/8 requests"; requests alone where the harness does not
    count documents; "" before anything is known."""
    requests = f"{t.done}/{t.total} requests" if t.total else (f"{t.done} requests" if t.done else "")
    if t.docs is None:
        return requests
    docs = f"{t.docs}/{t.docs_total} docs" if t.docs_total else f"{t.docs} docs"
    return f"{docs} · {requests}" if requests else docs


def _bar(done: int | None, total: int | None, width: int = 20) -> str:
    if not total:
        return ""
    filled = min(width, int(width * (done or 0) / total))
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
