"""`evaluate status [INVOCATION]`: where invocations stand (pending, running, succeeded, failed, cancelled)."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import json
from typing import Annotated

import typer

from ckpteval.cli import completion


def status_command(
    invocation: Annotated[
        str | None,
        typer.Argument(
            autocompletion=completion.invocations,
            help="An invocation id (or prefix); omit for the recent ones and the latest in full.",
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many recent invocations to list.")] = 20,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the state of an invocation and its tasks; without one, list recent invocations and show the latest."""
    from ckpteval import status
    from ckpteval import statuses as recent

    # one unreachable cluster must not hide the other invocations (`recent` says `unknown` for it)
    statuses = [status(invocation)] if invocation else recent(limit)
    if json_output:
        print(json.dumps([_as_json(s) for s in statuses], indent=2))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    if not statuses:
        console.print("No invocations recorded yet. Start one with `evaluate -c tiny`.")
        return
    if invocation:
        s = statuses[0]
        where = s.record.executor + (f" {s.executor_view.label}" if s.executor_view else "")
        console.print(
            f"[bold]{s.record.id}[/]  {s.state}  ({where}, profile {s.record.profile})"
            + (f"  [dim]{escape(s.detail)}[/]" if s.detail else "")
        )
        took = duration(s)
        console.print(
            f"model: {escape(s.record.model or '')}" + (f"  took: {took}" if took else ""),
            highlight=False,
            soft_wrap=True,
        )
        from ckpteval.cli.progress import count_text

        table = Table(header_style="bold")
        for col in ("task", "state", "progress"):  # documents (the results' n), requests as detail
            table.add_column(col)
        if s.snapshot:
            table.add_row("deployment", s.snapshot.deployment or "not started", "")
            for role, state in s.snapshot.others:  # a judge deployed beside the model
                table.add_row(role, state, "")
            for t in s.snapshot.tasks:
                table.add_row(t.name, t.state, count_text(t))
        console.print(table)
        if s.snapshot and s.snapshot.moved:
            console.print(f"[yellow]{escape(s.snapshot.moved)}[/]", highlight=False)
        if s.snapshot and s.snapshot.requests:
            from ckpteval.views import requests_in_words

            console.print(f"task requests: {escape(requests_in_words(s.snapshot.requests))}", highlight=False)
        from ckpteval.views import CAVEAT_MARK, judge_errors, recorded_caveats, recorded_usage

        for name, counted in judge_errors(s.record).items():  # a judged task's failed judge replies
            color = "yellow" if counted.errors else "dim"
            console.print(f"[{color}]{escape(name)}: {escape(counted.text())}[/]", highlight=False)
        used = recorded_usage(s.record)
        if used:
            console.print(escape(used), highlight=False)
        for line in recorded_caveats(s.record):
            console.print(f"[yellow]{CAVEAT_MARK} {escape(line)}[/]", highlight=False)
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
    from rich import box

    from ckpteval.cli.fit import print_fitting
    from ckpteval.views import score_summary

    # `where` only when it tells invocations apart (not every one ran here)
    show_where = any(s.record.where != "local" for s in statuses)
    header = ("invocation", "created", "model", *(["where"] if show_where else []), "state", "took", "scores")
    # no vertical rules, no outer padding: the list fits 80 columns
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in header:
        # the scores wrap between tasks; narrower than a task's summary, the list is stacked instead
        table.add_column(col, no_wrap=col != "scores", overflow="fold", min_width=32 if col == "scores" else None)
    rows = []
    for s in statuses:
        rows.append(
            [
                s.record.id,
                s.record.created.replace("T", " ").removesuffix("Z")[5:16],  # 11-27 21:12 (UTC)
                escape(model_name(s.record)),
                *([escape(s.record.where)] if show_where else []),
                escape(s.state + (f" ({s.detail})" if s.detail else "")),
                duration(s),
                # each task's first score and n (its task name alone until it has one)
                escape(score_summary(s.record) or " ".join(s.record.task_names)),
            ]
        )
        table.add_row(*rows[-1])
    print_fitting(console, table, header, rows)
    # then the latest in full, as `status ID` shows it: what `evaluate status` is run for after a --batch (not
    # when its cluster could not be reached: the list says why)
    if statuses[0].state == "unknown":
        return
    console.print(f"\n[dim]the latest invocation ({statuses[0].record.id}); `evaluate status ID` for another:[/]")
    status_command(statuses[0].record.id)


def model_name(record) -> str:
    """The model of an invocation in a few words: its label, or the last two parts of its checkpoint path."""
    if record.label:
        return record.label
    if not record.model:
        return ""
    parts = [p for p in record.model.rstrip("/").split("/") if p]
    return "/".join(parts[-2:]) if len(parts) > 1 else record.model


def duration(s) -> str:
    """How long it took, from its submission: until the job ended (the time it recorded, `state/ended`, read
    with its other state files here or on the cluster; an older job's `finished` mark where this machine has
    its job directory), or until now while it runs; "" when nothing says."""
    import time
    from datetime import datetime

    from ckpteval.cli.console import format_duration
    from ckpteval.views import finished_at

    def stamp(text: str) -> float | None:
        try:
            return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None

    created = stamp(s.record.created)
    if created is None:
        return ""
    if s.state in ("running", "pending"):
        return format_duration(max(0.0, time.time() - created))
    finished = (stamp(s.snapshot.ended) if s.snapshot and s.snapshot.ended else None) or finished_at(s.record)
    return "" if finished is None else format_duration(max(0.0, finished - created))


STATES = ("pending", "running", "succeeded", "failed", "cancelled", "interrupted", "skipped", "unknown")


def state_enum(state: str) -> tuple[str, int | None]:
    """A state as JSON gives it: one word of `STATES` and, for `failed 1`, the exit code apart."""
    word, _, rest = state.partition(" ")
    code = int(rest) if rest.strip().lstrip("-").isdigit() else None
    return (word if word in STATES else "unknown"), code


def _task_json(t) -> dict:
    state, code = state_enum(t.state)
    return {"name": t.name, "state": state} | ({"exit_code": code} if code is not None else {})


def _as_json(s) -> dict:
    from dataclasses import asdict

    from ckpteval.views import judge_errors, recorded_usage_json

    judged = judge_errors(s.record)
    tasks = (
        [
            _task_json(t)
            | {"done": t.done, "total": t.total}
            | ({"docs": t.docs, "docs_total": t.docs_total} if t.docs is not None else {})
            | ({"error": t.error, "log": t.log, "hint": t.hint or None} if t.error else {})
            | ({"judge_errors": asdict(judged[t.name])} if t.name in judged else {})
            for t in s.snapshot.tasks
        ]
        if s.snapshot
        else []
    )
    return {
        "invocation": s.record.id,
        "state": state_enum(s.state)[0],
        "detail": s.detail,
        **(s.executor_view.fields if s.executor_view else {}),
        "log_tail": s.log_tail,
        "executor": s.record.executor,
        "profile": s.record.profile,
        "created": s.record.created,
        "model": s.record.model,
        "deployment": s.snapshot.deployment if s.snapshot else None,
        # every deployment's state by role (the model's, and a judge deployed beside it)
        "deployments": s.snapshot.deployments if s.snapshot else None,
        "requests": (s.snapshot.requests or None) if s.snapshot else None,
        "tasks": tasks,
        # what it cost (results.json's `usage`: GPU-hours, wall, the split), once its results are here
        "usage": recorded_usage_json(s.record),
    }
