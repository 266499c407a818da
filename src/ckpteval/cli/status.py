"""`evaluate status [INVOCATION]`: where invocations stand (pending, running, succeeded, failed, cancelled)."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import json
from typing import Annotated

import typer


def status_command(
    invocation: Annotated[str | None, typer.Argument(help="An invocation id (or prefix); omit for all.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many recent invocations to list.")] = 20,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the state of an invocation and its tasks, or list recent invocations."""
    from ckpteval import status
    from ckpteval import statuses as recent

    # one unreachable cluster must not hide the other invocations (`recent` says `unknown` for it)
    statuses = [status(invocation)] if invocation else recent(limit)
    if json_output:
        print(json.dumps([_as_json(s) for s in statuses], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not statuses:
        console.print("No invocations recorded yet. Start one with `evaluate -c tiny`.")
        return
    if invocation:
        s = statuses[0]
        from rich.markup import escape

        where = s.record.executor + (f" job {s.slurm_job}" if s.slurm_job else "")
        console.print(
            f"[bold]{s.record.id}[/]  {s.state}  ({where}, profile {s.record.profile})"
            + (f"  [dim]{escape(s.detail)}[/]" if s.detail else "")
        )
        table = Table(header_style="bold")
        for col in ("task", "state", "progress"):
            table.add_column(col)
        if s.snapshot:
            table.add_row("deployment", s.snapshot.deployment or "not started", "")
            for t in s.snapshot.tasks:
                table.add_row(t.name, t.state, f"{t.done}/{t.total}" if t.total else (str(t.done) if t.done else ""))
        console.print(table)
        if s.snapshot and s.snapshot.requests:
            console.print(f"requests: {escape(s.snapshot.requests)}", highlight=False)
        for t in s.snapshot.tasks if s.snapshot else ():
            if t.error:
                log = f"{s.record.job_dir}/{t.log}" if t.log else ""
                console.print(f"[red]✗ {escape(t.name)} failed: {escape(t.error)}[/]", highlight=False)
                console.print(
                    f"  log: {escape(log)}" + (f"\n  hint: {escape(t.hint)}" if t.hint else ""), highlight=False
                )
        if s.log_tail:
            console.print("[red]last lines of the job's log:[/]")
            console.print(escape(s.log_tail), highlight=False)
        return
    table = Table(header_style="bold")
    for col in ("invocation", "created", "where", "state", "tasks"):
        table.add_column(col)
    for s in statuses:
        where = s.record.where
        table.add_row(
            s.record.id,
            s.record.created,
            where,
            s.state + (f" ({s.detail})" if s.detail else ""),
            ", ".join(s.record.task_names),
        )
    console.print(table)


def _as_json(s) -> dict:
    tasks = (
        [
            {"name": t.name, "state": t.state, "done": t.done, "total": t.total}
            | ({"error": t.error, "log": t.log, "hint": t.hint or None} if t.error else {})
            for t in s.snapshot.tasks
        ]
        if s.snapshot
        else []
    )
    return {
        "invocation": s.record.id,
        "state": s.state,
        "detail": s.detail,
        "slurm_job": s.slurm_job,
        "log_tail": s.log_tail,
        "executor": s.record.executor,
        "profile": s.record.profile,
        "created": s.record.created,
        "deployment": s.snapshot.deployment if s.snapshot else None,
        "requests": (s.snapshot.requests or None) if s.snapshot else None,
        "tasks": tasks,
    }
