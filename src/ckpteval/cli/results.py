"""`evaluate results INVOCATION...`: the score table again (several invocations side by side), or JSON."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def results_command(
    invocations: Annotated[list[str], typer.Argument(help="Invocation ids (or prefixes), compared side by side.")],
    json_output: Annotated[
        bool, typer.Option("--json", help="Print results.json content (a list for several).")
    ] = False,
) -> None:
    """Show the scores of one or more invocations (fetching them from the cluster if needed)."""
    from ckpteval.api import results as load_results
    from ckpteval.cli.table import print_table

    results = [load_results(i) for i in invocations]
    if json_output:
        data = [r.to_json() for r in results]
        print(json.dumps(data[0] if len(data) == 1 else data, indent=2))
        return
    print_table(results)
