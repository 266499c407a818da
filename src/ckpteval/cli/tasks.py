"""`evaluate tasks`: the task catalog."""

from __future__ import annotations

from typing import Annotated

import typer


def tasks_command(
    pattern: Annotated[str | None, typer.Argument(help="Only tasks whose name contains this text.")] = None,
    harness: Annotated[str | None, typer.Option("--harness", help="Only tasks of this harness.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the tasks `-t` accepts: name, harness, endpoint type, whether it needs log-probs, offline data."""
    from ckpteval.cli.render import print_catalog
    from ckpteval.tasks.catalog import load_catalog

    catalog = load_catalog()
    entries = catalog.search(pattern, harness=harness)
    print_catalog(entries, json_output=json_output)
