"""`evaluate results INVOCATION...`: the score table again (several invocations side by side), or JSON.

`evaluate results --watch RUN`: a watch run's scores, one row per iteration, one column per metric,
and a PNG plot of each metric against iteration (with stderr bands).
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import json
from pathlib import Path
from typing import Annotated

import typer

from ckpteval.cli import completion
from ckpteval.errors import ConfigError


def results_command(
    invocations: Annotated[
        list[str] | None,
        typer.Argument(
            autocompletion=completion.invocations, help="Invocation ids (or prefixes), compared side by side."
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print results.json content (a list for several).")
    ] = False,
    watch: Annotated[
        str | None, typer.Option("--watch", metavar="RUN", help="A watch run's scores, one row per iteration.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="With --watch: where to write the PNG (default: beside its state).")
    ] = None,
) -> None:
    """Show the scores of one or more invocations (fetching them from the cluster if needed)."""
    if watch:
        if invocations:
            raise ConfigError("--watch RUN shows a watch run; give no invocation ids with it.")
        _watch_results(watch, json_output=json_output, plot=plot)
        return
    if not invocations:
        raise ConfigError("Name the invocation(s) to show.", hint="`evaluate status` lists them.")
    from ckpteval import results as load_results
    from ckpteval.cli.table import print_table

    results = [load_results(i) for i in invocations]
    if json_output:
        data = [r.to_json() for r in results]
        print(json.dumps(data[0] if len(data) == 1 else data, indent=2))
        return
    print_table(results)


def _watch_results(run: str, *, json_output: bool, plot: Path | None) -> None:
    import ckpteval

    curves = ckpteval.watch_curves(run, draw=not json_output, plot=plot)
    state, rows, columns = curves.state, curves.rows, curves.columns
    if json_output:
        print(json.dumps({"run": state.run, "save_dir": state.spec.save_dir, "iterations": rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    table = Table(title=f"watch run {state.run}: {state.spec.save_dir}", title_justify="left", header_style="bold")
    table.add_column("iteration", justify="right")
    for key in columns:
        table.add_column(key, justify="right")
    table.add_column("state")
    table.add_column("invocation")
    for row in rows:
        cells = []
        for key in columns:
            value, stderr = row["scores"].get(key, (None, None))
            cells.append("" if value is None else f"{value:.4f}" + (f" ± {stderr:.4f}" if stderr is not None else ""))
        table.add_row(str(row["iteration"]), *cells, row["state"], row["invocation"] or "")
    console.print(table)
    if curves.plot is not None:
        console.print(f"plot: {curves.plot}")
