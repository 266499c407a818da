"""`evaluate resume INVOCATION [--follow]`: submit a stopped Slurm invocation's job again, where it stopped."""

from __future__ import annotations

from typing import Annotated

import typer


def resume_command(
    invocation: Annotated[str, typer.Argument(help="An invocation id (or prefix).")],
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Follow the job like --run: progress, log, then the scores.")
    ] = False,
) -> None:
    """Resubmit a stopped Slurm invocation (cancelled, preempted, timed out, failed) in its job directory.

    Finished tasks keep their results and are skipped; the interrupted task replays its cached responses.

    The Slurm request (nodes, time, partition) is the one recorded at submission.

    [bold]Examples[/]

      evaluate resume 1a2b3c4d            [dim]# resubmit and return[/]
      evaluate resume 1a2b3c4d --follow   [dim]# resubmit, follow, print the scores[/]
    """
    from ckpteval.cluster.launch import resume_invocation
    from ckpteval.job.invocation import load_record

    code = resume_invocation(load_record(invocation), attach_to=follow)
    if code:
        raise typer.Exit(code)
