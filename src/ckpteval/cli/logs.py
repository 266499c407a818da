"""`evaluate logs [INVOCATION] [-f]`: the job's log (deployment and tasks); the latest invocation's by default."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from typing import Annotated

import typer

from ckpteval.cli import completion


def logs_command(
    invocation: Annotated[
        str | None,
        typer.Argument(
            autocompletion=completion.invocations, help="An invocation id (or prefix); omit for the latest."
        ),
    ] = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing until the job ends.")] = False,
    source: Annotated[
        str,
        typer.Option(
            "--source",
            "-s",
            help="job (default), deployment, judge (a judge deployed beside it), export (vLLM/SGLang's export "
            "step), a task name, or slurm "
            "(nemo-run's sbatch output).",
        ),
    ] = "job",
) -> None:
    """Print an invocation's log: the job's own, the deployment's, or one task client's (of the latest
    invocation when none is named)."""
    from ckpteval import logs
    from ckpteval.cli.console import stderr_console
    from ckpteval.errors import ConfigError
    from ckpteval.views import invocation_ids

    if invocation is None:
        latest = invocation_ids()[:1]
        if not latest:
            raise ConfigError("No invocations recorded yet.", hint="Start one with `evaluate -c tiny`.")
        invocation = latest[0]
        stderr_console().print(f"[dim]the latest invocation: {invocation}[/]")
    for line in logs(invocation, follow=follow, source=source):
        print(line, flush=True)
