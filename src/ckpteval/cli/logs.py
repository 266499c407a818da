"""`evaluate logs INVOCATION [-f]`: the job's log (deployment and tasks)."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from typing import Annotated

import typer

from ckpteval.cli import completion


def logs_command(
    invocation: Annotated[
        str, typer.Argument(autocompletion=completion.invocations, help="An invocation id (or prefix).")
    ],
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing until the job ends.")] = False,
    source: Annotated[
        str,
        typer.Option(
            "--source", "-s", help="job (default), deployment, a task name, or slurm (nemo-run's sbatch output)."
        ),
    ] = "job",
) -> None:
    """Print an invocation's log: the job's own, the deployment's, or one task client's."""
    from ckpteval import logs

    for line in logs(invocation, follow=follow, source=source):
        print(line, flush=True)
