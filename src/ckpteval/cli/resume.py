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
    stderr_console().print(resume_plan(found), highlight=False, soft_wrap=True)
    started = time.monotonic()
    with ConsoleReporter() as reporter:
        outcome = resume(invocation, follow=follow, reporter=reporter)
    render_outcome(outcome, reporter.console, elapsed=time.monotonic() - started)
    if outcome.exit_status:
        raise typer.Exit(outcome.exit_status)


def resume_plan(found) -> str:
    """What `resume` is about to do, in words: which invocation (its command line), the tasks it skips
    (finished), replays (begun: their answered requests come from the cache) and runs."""
    import shlex

    record = found.record
    lines = [f"resuming invocation {record.id} ({found.state})"]
    if record.command_line:
        lines.append(f"  first run as: {shlex.join(record.command_line)}")
    tasks = found.snapshot.tasks if found.snapshot else ()
    done = [t.name for t in tasks if t.state == "succeeded"]
    begun = [t.name for t in tasks if t.state != "succeeded" and (t.done or t.docs)]
    rest = [t.name for t in tasks if t.name not in done and t.name not in begun]
    if not tasks:
        rest = list(record.task_names)
    if done:
        lines.append(f"  skips (finished): {', '.join(done)}")
    if begun:
        lines.append(f"  replays (begun; answered requests come from its cache): {', '.join(begun)}")
    if rest:
        lines.append(f"  runs: {', '.join(rest)}")
    return "\n".join(lines)
