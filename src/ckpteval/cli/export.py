"""`evaluate export INVOCATION [--to DESTINATION|inspect] [--out DIR]`: export a finished invocation (again).

`--to`'s choices are the registered export destinations (`views.export_destinations`: W&B and MLflow as
shipped), and `inspect` (Inspect logs, written on request)."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from ckpteval.cli import completion
from ckpteval.errors import ConfigError
from ckpteval.views import export_destinations

if TYPE_CHECKING:
    from ckpteval.types import Destination as ExportDestination


INSPECT = "inspect"
Destination = StrEnum("Destination", {name: name for name in [*export_destinations(), INSPECT]})  # type: ignore[misc]


def export_command(
    invocation: Annotated[
        str, typer.Argument(autocompletion=completion.invocations, help="An invocation id (or prefix).")
    ],
    to: Annotated[
        list[Destination] | None,
        typer.Option("--to", help="Where to export (repeatable); default: what the invocation's config enables."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="With --to inspect: the log directory (default: logs, what `inspect view` opens)."
        ),
    ] = None,
) -> None:
    """Export an invocation's results to W&B or MLflow (exporting again updates the same run), or write them
    as Inspect evaluation logs, one per task with its per-sample answers, for `inspect view`.

    [bold]Examples[/]

      evaluate export 1a2b3c4d                  [dim]# the destinations its config enables[/]
      evaluate export 1a2b --to wandb           [dim]# W&B, even if the config did not enable it[/]
      WANDB_MODE=offline evaluate export 1a2b   [dim]# write the run locally; `wandb sync` it later[/]
      evaluate export 1a2b --to inspect         [dim]# logs/*.eval, then: inspect view[/]
    """
    import ckpteval
    from ckpteval.cli.console import ConsoleReporter

    chosen = list(dict.fromkeys(to or []))
    if out is not None and Destination(INSPECT) not in chosen:
        raise ConfigError("--out is where Inspect logs go: give it with --to inspect.")
    if Destination(INSPECT) in chosen:
        written = ckpteval.export_inspect(invocation, out if out is not None else "logs")
        for task, path in written.items():
            typer.echo(f"{task}: {path}")
        log_dir = next(iter(written.values())).parent
        typer.echo(f"Open them with: inspect view --log-dir {log_dir}")
        chosen.remove(Destination(INSPECT))
        if not chosen:
            return
    with ConsoleReporter() as reporter:
        outcomes = ckpteval.export(
            invocation, [cast("ExportDestination", d.value) for d in chosen] or None, reporter=reporter
        )
    if any(o.status != "exported" for o in outcomes):
        raise typer.Exit(1)
