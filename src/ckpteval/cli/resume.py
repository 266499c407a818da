"""`evaluate resume INVOCATION [--follow]`: run a stopped invocation's job again, where it stopped."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from typing import Annotated

import typer

from ckpteval.cli import completion


def resume_command(
    invocation: Annotated[
        str, typer.Argument(autocompletion=completion.invocations, help="An invocation id (or prefix).")
    ],
    follow: Annotated[
        bool,
        typer.Option(
            "-f", "--follow", help="Follow a resubmitted Slurm job like --run: progress, log, then the scores."
        ),
    ] = False,
) -> None:
    """Run a stopped invocation (interrupted, cancelled, preempted, timed out, failed) again in its job directory.

    Finished tasks keep their results and are skipped; the interrupted task replays its cached responses.

    On Slurm the job is resubmitted with the Slurm request (nodes, time, partition) recorded at submission;
    on this machine it runs again and is followed (--follow is implied).

    [bold]Examples[/]

      evaluate resume 1a2b3c4d            [dim]# resubmit and return[/]
      evaluate resume 1a2b3c4d --follow   [dim]# resubmit, follow, print the scores[/]
    """
    import shlex
    import time

    from ckpteval import resume, status
    from ckpteval.cli.console import ConsoleReporter, render_outcome, stderr_console

    found = status(invocation)
    if found.state == "succeeded":  # every task finished: running its job again would only redeploy the model
        record = found.record
        console = stderr_console()
        console.print(
            f"invocation {record.id} succeeded already: nothing to resume. Its scores: evaluate results {record.id}"
        )
        if record.command_line:
            console.print(
                f"[dim]to evaluate again, as a new invocation: {shlex.join(record.command_line)}[/]", highlight=False
            )
        return
    started = time.monotonic()
    with ConsoleReporter() as reporter:
        outcome = resume(invocation, follow=follow, reporter=reporter)
    render_outcome(outcome, reporter.console, elapsed=time.monotonic() - started)
    if outcome.exit_status:
        raise typer.Exit(outcome.exit_status)
