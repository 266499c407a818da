"""Rendering helpers shared by commands (tables, JSON)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckpteval.types import TaskInfo


def print_catalog(tasks: Sequence[TaskInfo], *, json_output: bool) -> None:
    """Print catalog entries as a table, or as JSON for machines."""
    if json_output:
        print(json.dumps([t.to_json() for t in tasks], indent=2))
        return
    from rich.console import Console

    from ckpteval.cli.fit import fits

    console = Console()
    table = _catalog_table(f"{len(tasks)} tasks", tasks, with_harness=True)
    if fits(console, table):
        console.print(table)
        return
    # narrow: one table per harness, so a task name is never cut and its harness is never abridged
    harnesses = list(dict.fromkeys(t.harness for t in tasks))
    console.print(f"{len(tasks)} tasks in {len(harnesses)} harnesses")
    for harness in harnesses:
        group = [t for t in tasks if t.harness == harness]
        console.print()
        console.print(_catalog_table(f"{harness} ({len(group)})", group, with_harness=False))


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

    # no vertical rules: the catalog's long names fit 80 columns
    table = Table(title=escape(title), title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("task", *(["harness"] if with_harness else []), "endpoint", "needs", "offline data"):
        table.add_column(col, no_wrap=True)
    for t in tasks:
        table.add_row(
            escape(t.name),
            *([escape(t.harness)] if with_harness else []),
            ", ".join(t.endpoint_types),
            _needs(t),
            "yes" if t.offline_data else "",
        )
    return table
