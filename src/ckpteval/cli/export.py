"""`evaluate export INVOCATION [--to wandb|mlflow]`: export a finished invocation (again)."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from enum import StrEnum
from typing import Annotated

import typer


class Destination(StrEnum):
    wandb = "wandb"
    mlflow = "mlflow"


def export_command(
    invocation: Annotated[str, typer.Argument(help="An invocation id (or prefix).")],
    to: Annotated[
        list[Destination] | None,
        typer.Option("--to", help="Where to export (repeatable); default: what the invocation's config enables."),
    ] = None,
) -> None:
    """Export an invocation's results to W&B or MLflow; exporting again updates the same run.

    [bold]Examples[/]

      evaluate export 1a2b3c4d                  [dim]# the destinations its config enables[/]
      evaluate export 1a2b --to wandb           [dim]# W&B, even if the config did not enable it[/]
      WANDB_MODE=offline evaluate export 1a2b   [dim]# write the run locally; `wandb sync` it later[/]
    """
    from ckpteval import export
    from ckpteval.cli.console import ConsoleReporter

    with ConsoleReporter() as reporter:
        outcomes = export(invocation, [d.value for d in to] if to else None, reporter=reporter)
    if any(o.status != "exported" for o in outcomes):
        raise typer.Exit(1)
