"""Rendering helpers shared by commands (tables, JSON)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ckpteval.tasks.catalog import TaskSpec


def _datasets_json(task: TaskSpec) -> list[dict[str, Any]] | None:
    """The datasets the harness's definition of `task` loads (None: not known to ckpteval)."""
    from ckpteval.tasks.datasets import task_data

    data = task_data(task)
    if data.datasets is None:
        return None
    return [{"path": r.path, "name": r.name, "revision": r.revision, "splits": list(r.splits)} for r in data.datasets]


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
    if json_output:  # with the datasets each task loads (about a second to read lm-eval's task YAML)
        print(json.dumps([{**r, "datasets": _datasets_json(t)} for r, t in zip(rows, tasks, strict=True)], indent=2))
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
