"""Rendering helpers shared by commands (tables, JSON)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckpteval.types import TaskInfo


def print_catalog(tasks: Sequence[TaskInfo], *, json_output: bool, hint: str = "") -> None:
    """Print catalog entries as a table, or as JSON for machines (`hint`: said under an empty table)."""
    if json_output:
        print(json.dumps([t.to_json() for t in tasks], indent=2))
        return
    from rich.console import Console
    from rich.markup import escape

    from ckpteval.cli.fit import fits, stacked_lines

    console = Console()
    if not tasks:
        console.print("0 tasks" + (f"\n{hint}" if hint else ""), highlight=False)
        return
    table = _catalog_table(f"{len(tasks)} tasks", tasks, with_harness=True)
    if fits(console, table):
        console.print(table)
        return
    # narrow: one table per harness (whether it runs here in its title), so a task name is never cut and its
    # harness is never abridged; a harness whose table does not fit either is stacked, one block per task
    harnesses = list(dict.fromkeys(t.harness for t in tasks))
    console.print(f"{len(tasks)} tasks in {len(harnesses)} harnesses", highlight=False)
    for harness in harnesses:
        group = [t for t in tasks if t.harness == harness]
        here = group[0].runs_here
        where = "runs here" if here == "yes" else (f"{here} to run here" if here.startswith("needs") else here)
        title = f"{harness} ({len(group)}): {where}"
        console.print()
        table = _catalog_table(title, group, with_harness=False)
        if fits(console, table):
            console.print(table)
            continue
        # stacked: the columns on the task's line(s), its description under it, wrapped (never cut)
        from rich.padding import Padding

        console.print(escape(title), highlight=False)
        header, rows = _catalog_cells(group, with_harness=False, with_here=False)
        for row in rows:
            for line in stacked_lines(header[:-1], [row[:-1]], width=console.width):
                console.print(line, highlight=False)
            console.print(Padding(f"[dim]{row[-1]}[/]", (0, 0, 0, 2)), highlight=False)


def _catalog_cells(
    tasks: Sequence[TaskInfo], *, with_harness: bool, with_here: bool
) -> tuple[list[str], list[list[str]]]:
    from rich.markup import escape

    header = ["task", *(["harness"] if with_harness else []), "endpoint", "needs", "offline data"]
    header += [*(["runs here"] if with_here else []), "description"]
    rows = [
        [
            escape(t.name),
            *([escape(t.harness)] if with_harness else []),
            ", ".join(t.endpoint_types),
            _needs(t),
            "yes" if t.offline_data else "",
            *([escape(t.runs_here)] if with_here else []),
            escape(t.summary),
        ]
        for t in tasks
    ]
    return header, rows


def _needs(task: TaskInfo) -> str:
    """What a task needs of the endpoint: log-probs (a completions endpoint with echo), a judge model
    (`judge=...`; "(judge)": it can use one)."""
    needs = ["log-probs"] if task.needs_logprobs else []
    if task.judge:
        needs.append("judge" if task.judge == "needs" else "(judge)")
    return ", ".join(needs)


def _catalog_table(title: str, tasks: Sequence[TaskInfo], *, with_harness: bool):
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    # no vertical rules: the catalog's long names fit 80 columns; only the description wraps
    table = Table(title=escape(title), title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, show_edge=False)
    header, rows = _catalog_cells(tasks, with_harness=with_harness, with_here=with_harness)
    for col in header:
        if col == "description":
            table.add_column(col, min_width=24, overflow="fold")
        else:
            table.add_column(col, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table
