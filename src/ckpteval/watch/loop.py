"""The watcher: poll the save dir, submit an evaluation per ready checkpoint, follow them, export curves.

One poll: (1) one listing of the save dir; (2) the state of every evaluation in flight (finished ones
bring their scores; failed ones are retried up to `max_attempts`, then reported as failed); (3) new ready
checkpoints are recorded; (4) as many as `max_pending` allows are submitted (`--policy all`: oldest
first; `latest`: the newest, the older ones waiting are recorded as skipped); (5) the state is saved and
the scores that are in, in iteration order, go to the curves. Everything it does is reported as a
`WatchEvent` to a callback (the CLI prints them); nothing is printed here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ckpteval.errors import CkptevalError
from ckpteval.watch.readiness import SaveDirListing
from ckpteval.watch.state import Attempt, IterationEntry, WatchState, stop_file
from ckpteval.watch.submit import EvaluationState

OPEN_STATES = ("waiting", "submitted", "retry")


@dataclass(frozen=True)
class WatchEvent:
    """Something the watcher did or saw."""

    kind: str  # ready | incomplete | submitted | succeeded | retry | failed | skipped | exported | error
    message: str
    iteration: int | None = None
    invocation: str | None = None


class Pipeline(Protocol):
    """What the watcher needs from the evaluation pipeline (`ckpteval.watch.submit` in production)."""

    def submit(self, iteration: int, iter_dir: str) -> str: ...

    def state(self, invocation: str) -> EvaluationState: ...


@dataclass
class PollReport:
    """What one poll saw and did."""

    listing: SaveDirListing
    submitted: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)


class Watcher:
    """Drives one watch run; `poll()` once, or `run()` until stopped."""

    def __init__(
        self,
        state: WatchState,
        *,
        lister: Callable[[], SaveDirListing],
        pipeline: Pipeline,
        on_event: Callable[[WatchEvent], None] = lambda _e: None,
        exporter: Callable[[WatchState, list[IterationEntry]], str | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.lister = lister
        self.pipeline = pipeline
        self.on_event = on_event
        self.exporter = exporter
        self.clock = clock
        self.only: set[int] | None = None  # --once: the iterations ready at the first poll
        self._told_incomplete: set[int] = set()

    def poll(self) -> PollReport:
        """One poll (see the module docstring); the state is saved when anything changed."""
        listing = self.lister()
        report = PollReport(listing=listing)
        self._follow_in_flight(report)
        self._record_ready(listing)
        self._submit_what_fits(report)
        self.state.polls += 1
        self.state.last_poll = self.clock()
        self.state.save()
        self._export()
        return report

    def pending(self) -> list[IterationEntry]:
        """Entries not finished with yet (waiting, submitted, to retry)."""
        return [e for e in self.state.iterations.values() if e.state in OPEN_STATES]

    def run(self, *, once: bool = False, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Poll every `spec.every` seconds until stopped (`--once`: until what was ready at start is done)."""
        every = self.state.spec.every
        first = True
        while True:
            started = time.monotonic()
            report = self.poll()
            if once and first:
                self.only = {c.iteration for c in report.listing.ready}
            first = False
            if once and not self.pending():
                return
            while time.monotonic() - started < every:
                if should_stop() or stop_file(self.state.run).exists():
                    return
                time.sleep(min(0.2, every))
            if should_stop() or stop_file(self.state.run).exists():
                return

    def _emit(self, kind: str, message: str, entry: IterationEntry | None = None, invocation: str | None = None):
        self.on_event(WatchEvent(kind, message, entry.iteration if entry else None, invocation))

    def _follow_in_flight(self, report: PollReport) -> None:
        for entry in sorted(self.state.in_flight(), key=lambda e: e.iteration):
            attempt = entry.current
            assert attempt is not None
            try:
                now = self.pipeline.state(attempt.invocation)
            except CkptevalError as exc:
                self._emit("error", f"iteration {entry.iteration}: status unknown ({exc.message})", entry)
                continue
            if not now.finished:
                attempt.state = now.state
                continue
            attempt.state, attempt.ended_at = now.state, self.clock()
            report.finished.append(entry.iteration)
            results = now.results
            if now.state == "succeeded" and results is not None and results.status == "succeeded":
                from ckpteval.export.content import metric_values

                entry.state, entry.metrics = "succeeded", metric_values(results)
                scores = ", ".join(f"{k} {v:.4g}" for k, v in entry.metrics.items() if _is_score(k))
                self._emit("succeeded", f"iteration {entry.iteration}: {scores or 'no scores'}", entry, now.invocation)
                continue
            attempt.error = now.detail or f"the evaluation ended {now.state}"
            self._failed_attempt(entry, attempt)

    def _failed_attempt(self, entry: IterationEntry, attempt: Attempt) -> None:
        limit = self.state.spec.max_attempts
        if len(entry.attempts) < limit:
            entry.state = "retry"
            self._emit(
                "retry",
                f"iteration {entry.iteration}: attempt {len(entry.attempts)}/{limit} failed "
                f"({_last_line(attempt.error)}); it will be evaluated again",
                entry,
                attempt.invocation or None,
            )
        else:
            entry.state = "failed"
            entry.note = f"{limit} attempts failed; last: {_last_line(attempt.error)}"
            self._emit("failed", f"iteration {entry.iteration}: gave up, {entry.note}", entry, attempt.invocation)

    def _record_ready(self, listing: SaveDirListing) -> None:
        for ckpt in listing.checkpoints:
            if ckpt.iteration in self.state.iterations or (self.only is not None and ckpt.iteration not in self.only):
                continue
            if not ckpt.ready:
                if ckpt.iteration not in self._told_incomplete:
                    self._told_incomplete.add(ckpt.iteration)
                    self.on_event(
                        WatchEvent(
                            "incomplete",
                            f"iteration {ckpt.iteration}: not completely written yet "
                            f"(missing {', '.join(ckpt.missing)}); waiting",
                            ckpt.iteration,
                        )
                    )
                continue
            entry = IterationEntry(ckpt.iteration, ckpt.path, "waiting", first_seen_ready=self.clock())
            self.state.iterations[ckpt.iteration] = entry
            self._emit("ready", f"iteration {ckpt.iteration}: checkpoint complete", entry)

    def _submit_what_fits(self, report: PollReport) -> None:
        candidates = sorted(
            (e for e in self.state.iterations.values() if e.state in ("waiting", "retry")), key=lambda e: e.iteration
        )
        if not candidates:
            return
        slots = self.state.spec.max_pending - len(self.state.in_flight())
        if slots <= 0:
            return
        if self.state.spec.policy == "latest":
            newest = candidates[-1]
            for older in candidates[:-1]:
                older.state, older.note = "skipped", f"--policy latest: iteration {newest.iteration} was newer"
                self._emit("skipped", f"iteration {older.iteration}: skipped, {older.note}", older)
            candidates = [newest]
        for entry in candidates[:slots]:
            self._submit(entry, report)

    def _submit(self, entry: IterationEntry, report: PollReport) -> None:
        try:
            invocation = self.pipeline.submit(entry.iteration, entry.path)
        except CkptevalError as exc:
            attempt = Attempt(invocation="", submitted_at=self.clock(), state="failed", error=exc.message)
            attempt.ended_at = attempt.submitted_at
            entry.attempts.append(attempt)
            self._failed_attempt(entry, attempt)
            return
        entry.attempts.append(Attempt(invocation=invocation, submitted_at=self.clock()))
        entry.state = "submitted"
        report.submitted.append(entry.iteration)
        self.state.save()  # the invocation is known before anything else can go wrong
        latency = entry.attempts[-1].submitted_at - entry.first_seen_ready
        self._emit(
            "submitted",
            f"iteration {entry.iteration}: evaluation {invocation} submitted"
            + (f" (attempt {len(entry.attempts)})" if len(entry.attempts) > 1 else f" ({latency:.1f} s after ready)"),
            entry,
            invocation,
        )

    def _export(self) -> None:
        """Hand the next scores, in iteration order, to the exporter (curves: steps only grow)."""
        if self.exporter is None:
            return
        batch: list[IterationEntry] = []
        through = self.state.exported_through
        for entry in sorted(self.state.iterations.values(), key=lambda e: e.iteration):
            if entry.iteration <= self.state.exported_through:
                continue
            if entry.state in OPEN_STATES:
                break  # an earlier iteration is still to come: later points wait for it
            if entry.state == "succeeded":
                batch.append(entry)
            through = entry.iteration
        if through == self.state.exported_through:
            return
        try:
            message = self.exporter(self.state, batch) if batch else None
        except CkptevalError as exc:
            self._emit("error", f"exporting the curves failed ({exc.message}); will try again next poll")
            return
        self.state.exported_through = through
        self.state.save()
        if message:
            self._emit("exported", message)


def _is_score(key: str) -> bool:
    return not key.endswith(("_stderr", "/n_samples", "_std_dev"))


def _last_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1][:200] if lines else "no detail"
