"""`evaluate samples ID [-t TASK] [--wrong|--right] [--vs OTHER_ID] [--json]`: each document's prompt, answer,
target and score; with `--vs`, the documents whose score changed between two invocations, worst first."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import json
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from ckpteval.cli import completion
from ckpteval.errors import ConfigError

if TYPE_CHECKING:
    from ckpteval.types import DocumentAnswer, Flip

TERMINAL_LIMIT = 100
T = TypeVar("T")


def samples_command(
    invocation: Annotated[
        str, typer.Argument(autocompletion=completion.invocations, help="Invocation id (or prefix).")
    ],
    task: Annotated[str | None, typer.Option("--task", "-t", help="Only this task (default: every task).")] = None,
    wrong: Annotated[bool, typer.Option("--wrong", help="Only the documents the model got wrong.")] = False,
    right: Annotated[bool, typer.Option("--right", help="Only the documents the model got right.")] = False,
    vs: Annotated[
        str | None,
        typer.Option("--vs", metavar="OTHER_ID", help="The flips from this invocation to OTHER_ID, worst first."),
    ] = None,
    metric: Annotated[
        str | None, typer.Option("--metric", help="Score documents by this metric (default: the task's first).")
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", "-n", help=f"Documents per task (default: {TERMINAL_LIMIT}; with --json: all)."),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the documents as JSON.")] = False,
) -> None:
    """Each document's prompt (shortened), the model's answer, the target and the score; a document is right
    when its score is above 0.5. With --vs OTHER_ID: the documents both scored whose score changed (right →
    wrong first), each one's two answers side by side."""
    import ckpteval

    if wrong and right:
        raise ConfigError("--wrong and --right exclude each other.")
    if vs is not None and (wrong or right):
        raise ConfigError("--vs shows the flips between two invocations; give --wrong or --right without it.")
    if limit is not None and limit < 0:
        raise ConfigError(f"--limit must not be negative, not {limit}.")
    count = limit if limit is not None else (0 if json_output else TERMINAL_LIMIT)
    if vs is None:
        answers = ckpteval.samples(
            invocation, task=task, right=True if right else False if wrong else None, metric=metric
        )
        name, shown = answers.invocation, answers.tasks
        if json_output:
            data = {t: [a.to_json() for a in _first(rows, count)] for t, rows in shown.items()}
            print(json.dumps({"invocation": name, "tasks": data}, indent=2, ensure_ascii=False))
            return
        for t, rows in shown.items():
            _print_answers(name, t, rows, count)
        return
    changed = ckpteval.sample_flips(invocation, vs, task=task, metric=metric)
    if json_output:
        baseline, candidate = changed[0].baseline, changed[0].candidate
        data = {tf.task: [f.to_json() for f in _first(tf.flips, count)] for tf in changed}
        print(json.dumps({"baseline": baseline, "candidate": candidate, "tasks": data}, indent=2, ensure_ascii=False))
        return
    for tf in changed:
        _print_flips(tf.baseline, tf.candidate, tf.task, tf.flips, tf.common, count)


def _first(rows: list[T], count: int) -> list[T]:
    return rows if count == 0 else rows[:count]


def _score(value: float) -> str:
    return f"{value:g}" if value in (0.0, 1.0) else f"{value:.3f}"


def _print_answers(invocation: str, task: str, rows: list[DocumentAnswer], count: int) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ckpteval.views import shorten

    console = Console(highlight=False)
    metric = rows[0].metric if rows else ""
    title = f"{invocation} {task}: {len(rows)} documents" + (f", scored by {metric}" if metric else "")
    table = Table(title=escape(title), title_justify="left", header_style="bold")
    for col in ("document", "prompt", "answer", "target", "score"):
        # a document id is never broken (it is what `--vs` and the report name); the texts fold
        table.add_column(
            col, justify="right" if col == "score" else "left", overflow="fold", no_wrap=col in ("document", "score")
        )
    for a in _first(rows, count):
        style = "green" if a.right else "red"
        table.add_row(
            escape(a.sample),
            escape(shorten(a.prompt, 60, keep_end=True)),
            escape(shorten(a.shown_answer, 40)),
            escape(shorten(a.target, 30)),
            f"[{style}]{_score(a.score)}[/]",
        )
    console.print(table)
    if count and len(rows) > count:
        console.print(f"[dim]… {len(rows) - count} more (--limit 0 shows all)[/]")


def _print_flips(baseline: str, candidate: str, task: str, rows: list[Flip], common: int, count: int) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ckpteval.views import shorten

    console = Console(highlight=False)
    lost = sum(1 for f in rows if f.kind == "right → wrong")
    gained = sum(1 for f in rows if f.kind == "wrong → right")
    metric = rows[0].baseline.metric if rows else ""
    title = (
        f"{task} {metric}: {baseline} → {candidate}: {lost} right → wrong, {gained} wrong → right "
        f"({len(rows)} changed of {common} documents both scored)"
    )
    table = Table(title=escape(title), title_justify="left", header_style="bold")
    for col in ("document", "prompt", baseline, candidate, "target", "change"):
        table.add_column(escape(col), overflow="fold", no_wrap=col in ("document", "change"))
    for f in _first(rows, count):
        style = "red" if f.change < 0 else "green"
        table.add_row(
            escape(f.baseline.sample),
            escape(shorten(f.baseline.prompt, 50, keep_end=True)),
            escape(shorten(f.baseline.shown_answer, 30)),
            escape(shorten(f.candidate.shown_answer, 30)),
            escape(shorten(f.baseline.target, 24)),
            f"[{style}]{_score(f.baseline.score)} → {_score(f.candidate.score)}[/]",
        )
    console.print(table)
    if count and len(rows) > count:
        console.print(f"[dim]… {len(rows) - count} more (--limit 0 shows all)[/]")
