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
    from rich.table import Table

    table = Table(title=f"{len(tasks)} tasks", title_justify="left", header_style="bold")
    for col in ("task", "harness", "endpoint", "log-probs", "offline data"):
        table.add_column(col, no_wrap=col == "task")
    for t in tasks:
        table.add_row(
            t.name,
            t.harness,
            ", ".join(t.endpoint_types),
            "yes" if t.needs_logprobs else "",
            "yes" if t.offline_data else "",
        )
    Console().print(table)
