"""Attached mode (`--run`): follow a Slurm job until it ends, then bring its results back.

While the job runs: the progress display (deployment state, per task samples done/total, rate, time
left) redrawn from the job's state files, the job's log streamed above it, and a line whenever Slurm's
view changes (pending with its reason, running on which node). A dropped connection is reopened and the
following goes on. Ctrl-C asks whether to cancel the job or leave it running (without a terminal to ask
on, it is left running and the commands to follow it up are printed).

When it has ended: the result files are fetched, `results.json` written (here and on the cluster), the
score table printed; a failed job shows the end of its log. The exit code is the job's outcome.
"""

from __future__ import annotations

import posixpath
import sys
import time
from typing import TYPE_CHECKING

from ckpteval.cluster.jobview import LogTail, RemoteJobView
from ckpteval.cluster.slurm import SlurmJobState, job_state
from ckpteval.job.invocation import InvocationRecord
from ckpteval.job.manage import _task_dirs

if TYPE_CHECKING:
    from rich.console import Console

    from ckpteval.cluster.session import ClusterSession

POLL_SLURM_S = 3.0
UNKNOWN_GRACE_S = 120.0  # sacct can lag a new or just-ended job; longer than this, the job is gone


def print_submitted(record: InvocationRecord, console: Console, *, resumed: bool = False) -> None:
    """What `--batch` prints: the invocation id, the Slurm job, and the commands that follow it up."""
    what = "resubmitted" if resumed else "submitted"
    console.print(
        f"[green]✓[/] {what} invocation [bold]{record.id}[/] as Slurm job {record.slurm_job_id} "
        f"(profile {record.profile}); files on the cluster: {record.job_dir}"
    )
    for command, why in (
        ("status", "where it stands"),
        ("logs -f", "its log, as it runs"),
        ("cancel", "stop it"),
        ("results", "the scores, once it is done"),
    ):
        verb, _, flag = command.partition(" ")
        console.print(f"  evaluate {verb} {record.id}{' ' + flag if flag else ''}   [dim]# {why}[/]")
    print(record.id, flush=True)  # the id alone on stdout, for scripts


class _SlurmWatch:
    """Slurm's state of the job, asked at most every few seconds; says when it changes."""

    def __init__(self, session: ClusterSession, job_id: str, console: Console) -> None:
        self.session = session
        self.job_id = job_id
        self.console = console
        self.state: SlurmJobState | None = None
        self._asked = 0.0
        self._unknown_since: float | None = None

    def refresh(self, *, force: bool = False) -> SlurmJobState:
        if force or self.state is None or time.monotonic() - self._asked >= POLL_SLURM_S:
            self._asked = time.monotonic()
            new = self.session.call(lambda r: job_state(r, self.job_id))
            if self.state is None or (new.state, new.reason) != (self.state.state, self.state.reason):
                why = f" ({new.reason})" if new.reason else ""
                self.console.print(f"[cyan]Slurm job {self.job_id}: {new.state.lower()}{why}[/]")
            self.state = new
        return self.state

    def running(self) -> bool:
        state = self.refresh()
        if state.state != "UNKNOWN":
            self._unknown_since = None
            return state.active
        # right after submission, or while sacct lags: keep watching, for a while
        now = time.monotonic()
        self._unknown_since = self._unknown_since or now
        return now - self._unknown_since < UNKNOWN_GRACE_S


def follow_job(record: InvocationRecord, session: ClusterSession, console: Console) -> SlurmJobState:
    """Show the job's progress and stream its log until Slurm says it has ended; its final state.

    Raises KeyboardInterrupt on Ctrl-C (the caller decides what to do with the job).
    """
    from rich.markup import escape

    from ckpteval.cluster.manage import _progress_reader, state_dirs
    from ckpteval.job.follow import follow

    job_id = str(record.slurm_job_id)
    watch = _SlurmWatch(session, job_id, console)
    log = LogTail(session, posixpath.join(record.job_dir, "logs", "job.log"))
    view = RemoteJobView(session, record.job_dir)
    dirs = state_dirs(record)

    def tick(out: Console) -> None:
        view.prefetch(dirs)  # the redraw after this reads the state files from one round trip
        for line in log.read():
            out.print(f"[dim]│[/] {escape(line)}", highlight=False)

    follow(
        view,
        _task_dirs(record),
        is_running=watch.running,
        progress=_progress_reader(),
        interval=2.0,  # a redraw costs a remote command or two: cheap, but not free on a busy login node
        on_tick=tick,
        console=console,
    )
    for line in log.read(final=True):
        console.print(f"[dim]│[/] {escape(line)}", highlight=False)
    return watch.refresh(force=True)


def attach(record: InvocationRecord, session: ClusterSession, console: Console) -> int:
    """Follow the job until it ends (or Ctrl-C), then fetch and show its results; the job's exit code."""
    from rich.markup import escape

    from ckpteval.cluster.manage import fetch_results, log_tail
    from ckpteval.results.table import print_table

    console.print(f"following invocation [bold]{record.id}[/] (Ctrl-C to detach or cancel)")
    try:
        final = follow_job(record, session, console)
    except KeyboardInterrupt:
        return _interrupted(record, console)
    results = fetch_results(session, record, final=True)
    print_table([results])
    if results.status != "succeeded" or final.state != "COMPLETED":
        console.print(f"[red]the job ended {final.state.lower()}; last lines of its log:[/]")
        console.print(escape(log_tail(session, record)), highlight=False)
        return 1
    return 0


def _interrupted(record: InvocationRecord, console: Console) -> int:
    """Ctrl-C while following: cancel the job, or leave it running (the default without a terminal)."""
    from ckpteval.cluster.manage import slurm_cancel

    cancel = False
    if sys.stdin.isatty():
        from rich.prompt import Confirm

        try:
            cancel = Confirm.ask(
                f"\nCancel invocation {record.id} (Slurm job {record.slurm_job_id})? "
                "No leaves it running on the cluster",
                console=console,
                default=False,
            )
        except (KeyboardInterrupt, EOFError):
            cancel = False
    if cancel:
        console.print(slurm_cancel(record))
        return 130
    console.print(f"\nleft invocation {record.id} running on the cluster (Slurm job {record.slurm_job_id}).")
    for command in ("status", "logs", "cancel", "results"):
        console.print(f"  evaluate {command} {record.id}" + (" -f" if command == "logs" else ""))
    return 130
