"""The CLI's reporter: draws the library's events (`ckpteval.types`) on the terminal with rich,
and the questions that come after an outcome (cancel a followed Slurm job after Ctrl-C?)."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import sys
from typing import TYPE_CHECKING, Any

from ckpteval.types import (
    ExportOutcome,
    FollowEnded,
    LogLines,
    Note,
    Preview,
    Progress,
    ResultsReady,
    SquashEvent,
    Submitted,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live

    from ckpteval import Outcome
    from ckpteval.cli.progress import Rates
    from ckpteval.cli.squash import SquashProgress
    from ckpteval.types import InvocationRecord

_NOTE_STYLES = {"info": "dim", "notice": "", "warning": "yellow", "change": "cyan"}


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


class ConsoleReporter:
    """Renders events as they come: the preview, notes, live progress with the job's log above it, the
    squash progress, the score table, one line per export destination, the follow-up commands of a
    detached job. Use as a context manager (a live display is stopped on the way out)."""

    def __init__(self, console: Console | None = None, *, show_config: bool = False, json_output: bool = False) -> None:
        self.console = console or stderr_console()
        self.show_config = show_config
        self.json_output = json_output  # stdout is the results' JSON: the score table goes with the rest
        self._pending: Preview | None = None
        self._live: Live | None = None
        self._rates: Rates | None = None
        self._squash: SquashProgress | None = None

    def __enter__(self) -> ConsoleReporter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self._flush_preview()
        self.close()

    def __call__(self, event: Any) -> None:
        if not isinstance(event, SquashEvent):
            self._end_squash()
        if isinstance(event, Preview):
            # a dry run's preview is all it shows; a real run's header waits for the next event, so an
            # error before anything happened (an unreachable host) is the first thing on screen
            self._pending = event
            if event.dry_run:
                self._flush_preview()
            return
        self._flush_preview()
        if isinstance(event, Note):
            self._note(event)
        elif isinstance(event, Progress):
            self._progress(event)
        elif isinstance(event, LogLines):
            from rich.markup import escape

            out = self._live.console if self._live else self.console
            for line in event.lines:
                out.print(f"[dim]│[/] {escape(line)}", highlight=False)
        elif isinstance(event, FollowEnded):
            self._end_live()
        elif isinstance(event, SquashEvent):
            self._squash_event(event)
        elif isinstance(event, ResultsReady):
            from ckpteval.cli.table import print_table

            print_table([event.results], brief_seen_notes=True, console=self.console if self.json_output else None)
        elif isinstance(event, ExportOutcome):
            print_outcome(event)
        elif isinstance(event, Submitted):
            print_submitted(event.record, self.console, resumed=event.resumed)

    def _flush_preview(self) -> None:
        event, self._pending = self._pending, None
        if event is None:
            return
        from ckpteval.cli.preview import render_header, render_preview

        if event.dry_run or self.show_config:
            render_preview(event.compiled, invocation=event.invocation, panels=event.panels, dry_run=event.dry_run)
        else:
            render_header(event.compiled, event.invocation, self.console)

    def _note(self, note: Note) -> None:
        from rich.markup import escape

        style = _NOTE_STYLES[note.level]
        self.console.print(f"[{style}]{escape(note.text)}[/]" if style else escape(note.text))

    def _progress(self, event: Progress) -> None:
        if not self.console.is_terminal:
            return  # no terminal to redraw on: the log lines alone
        from ckpteval.cli.progress import Rates, render_progress

        if self._live is None:
            from rich.live import Live

            self._rates = Rates()
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.start()
        assert self._rates is not None
        self._live.update(render_progress(event.snapshot, self._rates, self.console.width))

    def _end_live(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _squash_event(self, event: SquashEvent) -> None:
        if self._squash is None:
            from ckpteval.cli.squash import SquashProgress

            self._squash = SquashProgress(self.console).__enter__()
        self._squash.on_event(event)

    def _end_squash(self) -> None:
        if self._squash is not None:
            self._squash.__exit__(None, None, None)
            self._squash = None

    def close(self) -> None:
        self._end_squash()
        self._end_live()


def print_outcome(outcome: ExportOutcome) -> None:
    """One line on stderr: green when exported, yellow when skipped, red when failed (plus the hint)."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    style = {"exported": "green", "skipped": "yellow", "failed": "red"}[outcome.status]
    label = {"exported": "exported", "skipped": "export skipped", "failed": "export failed"}[outcome.status]
    console.print(f"[{style}]{label}:[/] {escape(outcome.message)}")
    if outcome.hint:
        console.print(f"[dim]{escape(outcome.hint)}[/]")


def print_submitted(record: InvocationRecord, console: Console, *, resumed: bool = False) -> None:
    """What `--batch` prints: the invocation id, its job as its executor names it, and the commands that
    follow it up."""
    what = "resubmitted" if resumed else "submitted"
    console.print(
        f"[green]✓[/] {what} invocation [bold]{record.id}[/] as {record.job_label} "
        f"(profile {record.profile}); files there: {record.job_dir}"
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


def render_outcome(outcome: Outcome, console: Console, *, elapsed: float | None = None) -> None:
    """What follows the score table: why a job failed (its log's end), or what Ctrl-C did; then how
    long it took, where the results are and the commands that read them."""
    from rich.markup import escape

    if outcome.message:
        console.print(f"[red]{escape(outcome.message)}[/]")
        console.print(escape(outcome.log_tail), highlight=False)
    if outcome.state in ("succeeded", "failed", "cancelled") and outcome.record is not None:
        print_run_end(outcome, console, elapsed)
    if outcome.state != "interrupted" or outcome.record is None:
        return
    if outcome.still_running:
        _ask_cancel(outcome.record, console)
    else:
        console.print(
            f"stopped; finished tasks are kept. Go on where it stopped: [bold]evaluate resume {outcome.record.id}[/]"
        )


def print_run_end(outcome: Outcome, console: Console, elapsed: float | None) -> None:
    """The last lines of an attached run: state and elapsed time, the results file, what to run next."""
    from rich.markup import escape

    from ckpteval.views import results_file

    record = outcome.record
    assert record is not None
    took = f" in {format_duration(elapsed)}" if elapsed is not None else ""
    color = "green" if outcome.state == "succeeded" else "red"
    console.print(f"[{color}]{outcome.state}[/]{took} · invocation [bold]{record.id}[/]")
    results = results_file(record)
    if results is not None:
        console.print(f"results: {escape(str(results))}", highlight=False, soft_wrap=True)
    if outcome.state != "succeeded" or outcome.results is None or not outcome.results.tasks:
        # a run that did not finish every task: what happened and how to go on, not how to read its scores
        nexts: tuple[tuple[str, str], ...] = ((f"logs {record.id}", "what happened"),)
        if outcome.state != "succeeded":
            nexts += ((f"resume {record.id}", "run what did not finish, keep the rest"),)
    else:
        nexts = (
            (f"report {record.id}", "one HTML page: scores, CIs, charts"),
            (f"samples {record.id} --wrong", "the documents it got wrong"),
            (f"compare OTHER_ID {record.id}", "is it better than another invocation?"),
        )
    width = max(len(command) for command, _ in nexts)
    for command, why in nexts:
        console.print(f"  evaluate {command:<{width}}  [dim]# {why}[/]")


def format_duration(seconds: float) -> str:
    """`42s`, `3m 05s`, `2h 07m`: a duration at the precision a person reads."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def _ask_cancel(record: InvocationRecord, console: Console) -> None:
    """Ctrl-C while following a job that runs on: cancel it, or leave it running (the default without a
    terminal to ask on)."""
    from ckpteval import cancel

    wants = False
    if sys.stdin.isatty():
        from rich.prompt import Confirm

        try:
            wants = Confirm.ask(
                f"\nCancel invocation {record.id} ({record.job_label})? No leaves it running where it runs",
                console=console,
                default=False,
            )
        except (KeyboardInterrupt, EOFError):
            wants = False
    if wants:
        console.print(cancel(record))
        return
    console.print(f"\nleft invocation {record.id} running ({record.job_label}).")
    for command in ("status", "logs", "cancel", "results"):
        console.print(f"  evaluate {command} {record.id}" + (" -f" if command == "logs" else ""))
