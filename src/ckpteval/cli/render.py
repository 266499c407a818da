"""Rendering helpers shared by commands (tables, JSON)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ckpteval.tasks.catalog import TaskSpec


def print_catalog(tasks: Sequence[TaskSpec], *, json_output: bool) -> None:
    """Print catalog entries as a table, or as JSON for machines."""
    from ckpteval.tasks.offline_data import offline_source_key

    rows: list[dict[str, Any]] = [
        {
            "name": t.name,
            "qualified_name": t.qualified_name,
            "harness": t.harness,
            "endpoint_types": list(t.endpoint_types),
            "needs_logprobs": t.needs_logprobs,
            "offline_data": offline_source_key(t) is not None,
            "container": t.container,
            "description": t.description,
        }
        for t in tasks
    ]
    if json_output:
        print(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(rows)} tasks", title_justify="left", header_style="bold")
    for col in ("task", "harness", "endpoint", "log-probs", "offline data"):
        table.add_column(col, no_wrap=col == "task")
    for r in rows:
        table.add_row(
            r["name"],
            r["harness"],
            ", ".join(r["endpoint_types"]),
            "yes" if r["needs_logprobs"] else "",
            "yes" if r["offline_data"] else "",
        )
    Console().print(table)
