"""Tables that stay readable in a narrow terminal: drawn as a table where it fits, else stacked, one block
per row (its name, then `column value` pairs), so no header or cell is ever cut to a few letters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

_SEPARATOR = " · "


def fits(console: Console, table: Table) -> bool:
    """Whether the table fits the console without cutting a cell: its natural width, or, when some of its
    columns may wrap (their words go onto more lines, none is cut), its narrowest."""
    from rich.measure import Measurement

    measured = Measurement.get(console, console.options.update_width(10_000), table)
    wraps = any(not column.no_wrap for column in table.columns)
    return (measured.minimum if wraps else measured.maximum) <= console.width


def print_fitting(
    console: Console,
    table: Table,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    name_columns: int = 1,
) -> None:
    """Print `table` when it fits; else `stacked_lines` of the same plain cells (markup in them is kept)."""
    if fits(console, table):
        console.print(table)
        return
    if table.title:
        console.print(table.title)
    for line in stacked_lines(header, rows, width=console.width, name_columns=name_columns):
        console.print(line, highlight=False, soft_wrap=True)


def stacked_lines(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, width: int, name_columns: int = 1
) -> list[str]:
    """One block per row: the first `name_columns` cells as its name (a blank one repeats the row above's,
    as a table shows a task once for its metrics), then `column value` pairs flowed into indented lines
    of at most `width` columns (a pair longer than that wraps between its words, its style left). Empty cells
    are left out."""
    import textwrap

    from rich.markup import escape
    from rich.text import Text

    lines: list[str] = []
    previous: list[str] = [""] * name_columns
    for row in rows:
        name = [cell or previous[i] for i, cell in enumerate(row[:name_columns])]
        previous = name
        lines.append("[bold]" + "  ".join(c for c in name if c) + "[/]")
        current, current_len = "", 0
        for label, cell in zip(header[name_columns:], row[name_columns:], strict=True):
            if not cell:
                continue
            pair = f"[dim]{escape(label)}[/] {cell}"
            plain = Text.from_markup(cell).plain
            plain_len = len(label) + 1 + len(plain)
            if 2 + plain_len > width:  # longer than a line itself: on lines of its own, wrapped between words
                if current:
                    lines.append("  " + current)
                    current, current_len = "", 0
                wrapped = textwrap.wrap(
                    f"{label} {plain}",
                    width - 2,
                    subsequent_indent="  ",
                    break_long_words=False,
                    break_on_hyphens=False,
                )
                lines.append(f"  [dim]{escape(label)}[/]{escape(wrapped[0][len(label) :])}")
                lines.extend("  " + escape(w) for w in wrapped[1:])
                continue
            if current and 2 + current_len + len(_SEPARATOR) + plain_len > width:
                lines.append("  " + current)
                current, current_len = "", 0
            current = current + _SEPARATOR + pair if current else pair
            current_len += (len(_SEPARATOR) if current_len else 0) + plain_len
        if current:
            lines.append("  " + current)
    return lines
