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


def render_progress(snapshot: JobSnapshot, rates: Rates, width: int = 120):
    """The progress table: one row per task, or two where a task's widest row would not fit `width` (its
    requests, rate and time left on the second); every column's width is fixed by the totals, so nothing
    moves or wraps anew from one frame to the next."""
    from rich.table import Table

    tasks = snapshot.tasks
    name_w = max([len("deployment"), *(len(t.name) for t in tasks)])
    docs_w = max([0, *(len(_docs_text(t, widest=True)) for t in tasks)])
    detail_w = max([0, *(len(_detail_text(t, None, "", widest=True)) for t in tasks)])
    bar_w = 20
    # name, state (succeeded), bar + docs, detail, with the grid's 2-column gaps
    one_line = name_w + 2 + 9 + 2 + bar_w + 1 + docs_w + 2 + detail_w + len(" · 9999.9 req/s · 99,999 s left")
    two_lines = one_line > width
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True, min_width=name_w)
    table.add_column(no_wrap=True, min_width=9)
    table.add_column(no_wrap=True)
    dep = snapshot.deployment or "not started"
    table.add_row("[bold]deployment[/]", _color(dep), _moved(snapshot.moved))
    for role, state in snapshot.others:  # a judge deployed beside the model
        table.add_row(f"[bold]{role}[/]", _color(state), "")
    for t in tasks:
        docs = _docs_text(t)
        total, done = (t.docs_total, t.docs) if t.docs is not None else (t.total, t.done)
        bar = _bar(done, total, bar_w)
        progress = f"{bar} {docs.rjust(docs_w)}" if bar and docs else docs
        rate = rates.rate(t)
        eta = f"{(t.total - t.done) / rate:,.0f} s left" if rate and t.total and t.done < t.total else ""
        detail = _detail_text(t, rate, eta)
        if two_lines:
            table.add_row(f"[bold]{t.name}[/]", _color(t.state), progress)
            if detail:
                table.add_row("", "", f"[dim]{detail}[/]")
        else:
            table.add_row(f"[bold]{t.name}[/]", _color(t.state), f"{progress} · {detail}" if detail else progress)
    return table


def _moved(sentence: str) -> str:
    """The job's words for a deployment on another port than planned, short enough for the progress row:
    `on port 41873 (8000 was taken)`."""
    import re

    found = re.match(r"port (\d+) was taken: the deployment serves on port (\d+)", sentence)
    if not sentence:
        return ""
    return f"[yellow]{f'on port {found[2]} ({found[1]} was taken)' if found else sentence}[/]"


def _docs_text(t: TaskSnapshot, *, widest: bool = False) -> str:
    """The first count: documents where the harness counts them, else requests (`widest`: at its widest)."""
    if t.docs is not None:
        done = t.docs_total if widest and t.docs_total else t.docs
        return f"{done}/{t.docs_total} docs" if t.docs_total else f"{done} docs"
    done = t.total if widest and t.total else t.done
    return f"{done}/{t.total} requests" if t.total else (f"{done} requests" if done else "")


def _detail_text(t: TaskSnapshot, rate: float | None, eta: str, *, widest: bool = False) -> str:
    """The requests behind a task's documents, its rate and time left ("" for a harness counting requests)."""
    parts = []
    if t.docs is not None and (t.total or t.done):
        done = t.total if widest and t.total else t.done
        parts.append(f"{done}/{t.total} requests" if t.total else f"{done} requests")
    if rate:
        parts.append(f"{rate:.1f} req/s")
    if eta:
        parts.append(eta)
    return " · ".join(parts)


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
