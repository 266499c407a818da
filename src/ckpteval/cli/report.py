"""`evaluate report ID... -o report.html`: one self-contained HTML report; `--png DIR` writes its charts as PNG."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from pathlib import Path
from typing import Annotated

import typer

from ckpteval.cli import completion


def report_command(
    invocations: Annotated[
        list[str] | None,
        typer.Argument(
            autocompletion=completion.invocations, help="Invocation ids (or prefixes); the first is the baseline."
        ),
    ] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path("report.html"),
    watch: Annotated[
        list[str] | None,
        typer.Option("--watch", metavar="RUN", help="A watch run's scores against iteration (repeatable)."),
    ] = None,
    png: Annotated[
        Path | None, typer.Option("--png", help="Also write each task's chart as <DIR>/<task>.png (for papers).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the comparison's resampling.")] = 0,
) -> None:
    """Write one HTML file (no network needed to open it): the score table with standard errors and 95 %
    intervals, a bar chart per task, for two or more invocations each one's comparison with the first and the
    documents whose score changed (prompts, both answers), and for each `--watch RUN` its scores against
    iteration and each checkpoint's verdicts."""
    import ckpteval

    written = ckpteval.report(invocations or (), output, watch=watch or (), png=png, seed=seed)
    for path in written:
        typer.echo(f"wrote {path}")
