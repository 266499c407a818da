"""The score table drawn with rich (its rows: `ckpteval.views.table_rows`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ckpteval.types import InvocationResults
from ckpteval.views import CAVEAT_MARK, FAILED_MARK, table_rows

if TYPE_CHECKING:
    from rich.console import Console

OFFLINE_MARK = "†"


def print_table(
    results: Sequence[InvocationResults], *, brief_seen_notes: bool = False, console: Console | None = None
) -> None:
    """Print the score table with rich (on stdout, or `console`). `brief_seen_notes` (the end of a run): an
    offline-data footnote the user was shown before is said in one line (`evaluate results` shows it in full)."""
    from rich.console import Console
    from rich.table import Table

    from ckpteval.cli.fit import print_fitting

    header, rows, footnotes = table_rows(results)
    title = "scores" if len(results) > 1 else f"scores — invocation {results[0].invocation}"
    table = Table(title=title, title_justify="left", header_style="bold")
    first_value = header.index("metric") + 1  # task[, mode], metric: left; scores and n: right
    for i, col in enumerate(header):
        table.add_column(col, justify="right" if i >= first_value else "left", no_wrap=True)
    styled = [[_style(c) for c in row] for row in rows]
    for row in styled:
        table.add_row(*row)
    console = console or Console()
    print_fitting(console, table, header, styled, name_columns=first_value)
    for note in footnotes:
        if brief_seen_notes and note.startswith(OFFLINE_MARK):
            from ckpteval.views import note_seen_before

            if note_seen_before(note):
                task = note.removeprefix(OFFLINE_MARK).strip().partition(":")[0]
                note = f"{OFFLINE_MARK} {task}: offline stand-in data, as before (evaluate results shows the note)"
        color = "red" if note.startswith(FAILED_MARK) else "yellow" if note.startswith(CAVEAT_MARK) else "dim"
        console.print(f"[{color}]{_escape(note)}[/]", highlight=False)  # mode names hold brackets: pass@1[avg-of-k]


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _style(cell: str) -> str:
    from rich.markup import escape

    if cell.startswith("failed") or cell == "cancelled":
        return f"[red]{escape(cell)}[/]"
    return escape(cell)
