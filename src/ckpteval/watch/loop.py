"""The watcher: poll the save dir, submit an evaluation per ready checkpoint, follow them, export curves.

Two cadences: the save dir is listed every `--every` seconds (a poll); the evaluations in flight are
asked how they are doing every `follow_every` seconds (a few), so a finished evaluation is seen, its slot
reused and its scores exported within seconds, and `--once` ends within seconds of its last evaluation.
Nothing waits forever: an evaluation past its deadline (`eval_timeout`) is cancelled and counts as a
failed attempt, as does one whose status could not be read `status_error_limit` times in a row; every
error is reported as an event and kept in the state for `watch status`.

One poll: (1) one listing of the save dir; (2) the state of every evaluation in flight (finished ones
bring their scores; failed ones are retried up to `max_attempts`, then reported as failed); (3) new ready
checkpoints are recorded; (4) as many as `max_pending` allows are submitted (`--policy all`: oldest
first; `latest`: the newest, the older ones waiting are recorded as skipped); (5) the state is saved and
the scores that are in, in iteration order, go to the curves. Everything it does is reported as a
`WatchEvent` to a callback (the CLI prints them); nothing is printed here.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ckpteval.errors import CkptevalError
from ckpteval.watch.readiness import CheckpointStatus, SaveDirListing
from ckpteval.watch.state import Attempt, IterationEntry, WatchState, stop_requested
from ckpteval.watch.submit import EvaluationState
from ckpteval.watch.verdicts import verdict_lines

OPEN_STATES = ("waiting", "submitted", "retry")


@dataclass(frozen=True)
class WatchEvent:
    """Something the watcher did or saw."""

    # ready | incomplete | submitted | adopted | succeeded | verdict | retry | failed | skipped | exported | error
    # | deployment (kept across checkpoints or not, and why: `watch.kept`)
    kind: str
    message: str
    iteration: int | None = None
    invocation: str | None = None


def add_usage(entry: IterationEntry, usage: dict[str, Any] | None) -> None:
    """Add one evaluation's usage (results.json's `usage`) to its checkpoint's sums."""
    if not usage:
        return
    total = entry.usage
    for key in ("gpu_hours", "wall_seconds", "cpu_seconds"):
        if isinstance(usage.get(key), int | float):
            total[key] = round(float(total.get(key, 0.0)) + float(usage[key]), 6)
    total["attempts"] = int(total.get("attempts", 0)) + 1
    total["kept"] = usage.get("deployment") == "kept"
    for phase, seconds in (usage.get("phases") or {}).items():
        total[f"{phase}_seconds"] = round(float(total.get(f"{phase}_seconds", 0.0)) + float(seconds), 3)


def usage_words(usage: dict[str, Any]) -> str:
    """'; 0.003 GPU-h, 41 s (start-up 3 s)' or '; CPU, 41 s (start-up 3 s)': a checkpoint's sums, for the terminal."""
    if not usage:
        return ""
    cost = f"{usage['gpu_hours']:.3g} GPU-h" if usage.get("gpu_hours") else "CPU"
    startup = f" (start-up {usage['startup_seconds']:.0f} s)" if "startup_seconds" in usage else ""
    return f"; {cost}, {usage.get('wall_seconds', 0.0):.0f} s{startup}"


class Pipeline(Protocol):
    """What the watcher needs from the evaluation pipeline (`ckpteval.watch.submit` in production)."""

    def submit(self, iteration: int, iter_dir: str, invocation: str) -> str: ...

    def adopt(self, iteration: int, iter_dir: str, invocation: str) -> bool:
        """Whether the submission of `invocation` (its id chosen by the watcher) got far enough to be recorded:
        then it is this iteration's evaluation, to be followed (not submitted again)."""
        ...

    def state(self, invocation: str) -> EvaluationState: ...

    def cancel(self, invocation: str) -> str: ...


@dataclass
class PollReport:
    """What one poll saw and did (`listing` is None when the save dir could not be listed this time)."""

    listing: SaveDirListing | None
    submitted: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)


class Watcher:
    """Drives one watch run; `poll()` once, `follow()` the evaluations in flight, or `run()` until stopped."""

    def __init__(
        self,
        state: WatchState,
        *,
        lister: Callable[[], SaveDirListing],
        pipeline: Pipeline,
        on_event: Callable[[WatchEvent], None] = lambda _e: None,
        exporter: Callable[[WatchState, list[IterationEntry]], str | None] | None = None,
        judge: Callable[[WatchState, IterationEntry], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.lister = lister
        self.pipeline = pipeline
        self.on_event = on_event
        self.exporter = exporter
        self.judge = judge  # compares a finished checkpoint with the previous one and the best (verdicts)
        self.clock = clock
        self.only: set[int] | None = None  # --once: the iterations ready at the first poll
        self.started = clock()  # a stop file written before this is not for this watcher
        self._told_incomplete: set[int] = set()
        self._reconciled = False

    def reconcile(self) -> None:
        """Settle the submissions a killed watcher left half-done (once, before the first poll).

        A submission is recorded as an intent first (an attempt in state `submitting`, with the invocation
        id it will get), then made, then marked `submitted`. An intent whose invocation was recorded is
        adopted: followed like any evaluation in flight. One whose invocation was never recorded did not
        happen: it is dropped, and the checkpoint is submitted again."""
        self._reconciled = True
        changed = False
        for entry in sorted(self.state.iterations.values(), key=lambda e: e.iteration):
            attempt = entry.current
            if attempt is None or attempt.state != "submitting":
                continue
            changed = True
            if self.pipeline.adopt(entry.iteration, entry.path, attempt.invocation):
                attempt.state, entry.state = "submitted", "submitted"
                self._emit(
                    "adopted",
                    f"iteration {entry.iteration}: following evaluation {attempt.invocation}, submitted by a "
                    "watcher that stopped before it recorded it",
                    entry,
                    attempt.invocation,
                )
                continue
            entry.attempts.pop()
            entry.state = "retry" if entry.attempts else "waiting"
            self._emit(
                "ready", f"iteration {entry.iteration}: its submission was interrupted before it was made", entry
            )
        if changed:
            self.state.save()

    def poll(self) -> PollReport:
        """One poll (see the module docstring); the state is saved when anything changed.

        The first listing's error is raised (a wrong path or profile fails at once); a later one is reported
        and the poll goes on with the evaluations in flight."""
        if not self._reconciled:
            self.reconcile()
        try:
            listing: SaveDirListing | None = self.lister()
        except (CkptevalError, OSError) as exc:
            if not self.state.polls:
                raise
            listing = None
            self._error(f"listing the save dir failed ({_message(exc)}); trying again next poll")
        report = PollReport(listing=listing)
        report.finished = self._follow_in_flight()
        if listing is not None:
            self._record_ready(listing)
        self._submit_what_fits(report)
        self.state.polls += 1
        self.state.last_poll = self.clock()
        self.state.next_poll = self.state.last_poll + self.state.spec.every
        self.state.save()
        self._export()
        return report

    def follow(self) -> PollReport:
        """Ask the evaluations in flight how they are doing (no listing): a finished one frees its slot for
        the next checkpoint waiting, and its scores go to the curves at once."""
        report = PollReport(listing=None)
        report.finished = self._follow_in_flight()
        self._submit_what_fits(report)
        self.state.last_follow = self.clock()
        self.state.save()
        if report.finished:
            self._export()
        return report

    def pending(self) -> list[IterationEntry]:
        """Entries not finished with yet (waiting, submitted, to retry)."""
        return [e for e in self.state.iterations.values() if e.state in OPEN_STATES]

    def stop_asked(self) -> bool:
        """Whether `evaluate watch stop` asked this watcher to end (its stop file)."""
        return stop_requested(self.state.run, since=self.started)

    def run(
        self,
        *,
        once: bool = False,
        should_stop: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> str:
        """Poll the save dir every `spec.every` seconds and follow the evaluations in flight every
        `spec.follow_every` seconds, until stopped ("stopped") or, `--once`, until what was ready at the
        first poll is done ("done"). Every evaluation has a deadline, so `--once` always ends."""
        spec = self.state.spec
        follow_every = spec.follow_every or 5.0  # 0: the default (open_watch sets where it runs)
        if should_stop() or self.stop_asked():
            return "stopped"
        report = self.poll()
        if once:
            self.only = {c.iteration for c in report.listing.ready} if report.listing else set()
        next_poll = time.monotonic() + spec.every
        next_follow = time.monotonic() + follow_every
        while True:
            if once and not self.pending():
                return "done"
            if should_stop() or self.stop_asked():
                return "stopped"
            now = time.monotonic()
            if now >= next_poll:
                self.poll()
                next_poll, next_follow = now + spec.every, now + follow_every
            elif now >= next_follow:
                if self.state.in_flight():
                    self.follow()
                next_follow = now + follow_every
            else:
                sleep(max(0.0, min(0.2, next_poll - now, next_follow - now)))

    def _emit(self, kind: str, message: str, entry: IterationEntry | None = None, invocation: str | None = None):
        self.on_event(WatchEvent(kind, message, entry.iteration if entry else None, invocation))

    def _error(self, message: str, entry: IterationEntry | None = None) -> None:
        self.state.note_error(message, at=self.clock())
        self._emit("error", message, entry)

    def _follow_in_flight(self) -> list[int]:
        finished: list[int] = []
        for entry in sorted(self.state.in_flight(), key=lambda e: e.iteration):
            attempt = entry.current
            assert attempt is not None
            if attempt.state == "submitting":
                continue  # an intent: settled by `reconcile`
            try:
                now = self.pipeline.state(attempt.invocation)
            except (CkptevalError, OSError) as exc:
                attempt.status_errors += 1
                limit = self.state.spec.status_error_limit
                if attempt.status_errors < limit:
                    self._error(
                        f"iteration {entry.iteration}: status unknown ({_message(exc)}); "
                        f"query {attempt.status_errors} of {limit} in a row",
                        entry,
                    )
                    continue
                self._give_up(entry, attempt, f"no status after {limit} queries in a row (last: {_message(exc)})")
                finished.append(entry.iteration)
                continue
            attempt.status_errors = 0
            if not now.finished:
                attempt.state = now.state
                limit_s = self.state.spec.eval_timeout
                if limit_s is not None and self.clock() - attempt.submitted_at > limit_s:
                    self._give_up(entry, attempt, f"it did not finish within {_duration(limit_s)} (--eval-timeout)")
                    finished.append(entry.iteration)
                continue
            attempt.state, attempt.ended_at = now.state, self.clock()
            finished.append(entry.iteration)
            results = now.results
            if results is not None:
                add_usage(entry, results.usage)
            if now.state == "succeeded" and results is not None and results.status == "succeeded":
                from ckpteval.export.content import metric_values

                entry.state, entry.metrics = "succeeded", metric_values(results)
                entry.content = _served_content(results)
                scores = ", ".join(f"{k} {v:.4g}" for k, v in entry.metrics.items() if _is_score(k))
                message = f"iteration {entry.iteration}: {scores or 'no scores'}" + usage_words(entry.usage)
                self._emit("succeeded", message, entry, now.invocation)
                self._judge(entry)
                continue
            attempt.error = now.detail or f"the evaluation ended {now.state}"
            self._failed_attempt(entry, attempt)
        return finished

    def _give_up(self, entry: IterationEntry, attempt: Attempt, why: str) -> None:
        """End an attempt the watcher can no longer wait for: cancel its job (best effort), count it failed."""
        try:
            self.pipeline.cancel(attempt.invocation)
        except (CkptevalError, OSError) as exc:
            why += f"; cancelling it failed too ({_message(exc)})"
        attempt.state, attempt.ended_at, attempt.error = "cancelled", self.clock(), why
        self._error(f"iteration {entry.iteration}: evaluation {attempt.invocation} given up: {why}", entry)
        self._failed_attempt(entry, attempt)

    def _judge(self, entry: IterationEntry) -> None:
        if self.judge is None:
            return
        try:
            self.judge(self.state, entry)
        except (CkptevalError, OSError) as exc:
            self._error(f"iteration {entry.iteration}: no verdict ({_message(exc)})", entry)
            return
        for line in verdict_lines(entry):
            self._emit("verdict", f"iteration {entry.iteration}: {line}", entry)

    def _failed_attempt(self, entry: IterationEntry, attempt: Attempt) -> None:
        limit = self.state.spec.max_attempts
        made = attempts_made(entry)
        if made < limit:
            entry.state = "retry"
            self._emit(
                "retry",
                f"iteration {entry.iteration}: attempt {made}/{limit} failed "
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
            if self.only is not None and ckpt.iteration not in self.only:
                continue
            if ckpt.iteration in self.state.iterations and not self._rewritten(ckpt):
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
            entry = IterationEntry(ckpt.iteration, ckpt.path, "waiting", first_seen_ready=self.clock(), save=ckpt.save)
            self.state.iterations[ckpt.iteration] = entry
            self._emit("ready", f"iteration {ckpt.iteration}: checkpoint complete", entry)

    def _rewritten(self, ckpt: CheckpointStatus) -> bool:
        """Whether `ckpt` is another save of an iteration already evaluated (a restarted or rolled-back training
        rewrote it: its markers' times changed); its earlier entry then moves to `state.rewritten` (the curve
        rows keep both), and the iteration is evaluated again."""
        entry = self.state.iterations[ckpt.iteration]
        if entry.state in OPEN_STATES or not ckpt.ready or not entry.save or not ckpt.save or ckpt.save == entry.save:
            return False
        self.state.rewritten.append(entry)
        del self.state.iterations[ckpt.iteration]
        self._emit(
            "rewritten",
            f"iteration {ckpt.iteration}: saved again since it was evaluated "
            f"({entry.state}{', content ' + entry.content[:12] if entry.content else ''}); evaluating it again",
            entry,
        )
        return True

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
        from ckpteval.invocation.record import new_invocation_id

        # the intent first: a watcher killed from here on finds this invocation id at its restart and
        # adopts the evaluation if it was submitted (`reconcile`), so nothing is evaluated twice
        attempt = Attempt(invocation=new_invocation_id(), submitted_at=self.clock(), state="submitting")
        entry.attempts.append(attempt)
        entry.state = "submitted"
        self.state.save()
        try:
            attempt.invocation = self.pipeline.submit(entry.iteration, entry.path, attempt.invocation)
        except (CkptevalError, OSError) as exc:
            attempt.state, attempt.error, attempt.ended_at = "failed", _message(exc), self.clock()
            self._failed_attempt(entry, attempt)
            self.state.save()
            return
        attempt.state = "submitted"
        report.submitted.append(entry.iteration)
        self.state.save()  # the evaluation is known before anything else can go wrong
        latency = self.clock() - entry.first_seen_ready  # ready -> submitted
        self._emit(
            "submitted",
            f"iteration {entry.iteration}: evaluation {attempt.invocation} submitted"
            + (f" (attempt {attempts_made(entry)})" if attempts_made(entry) > 1 else f" ({latency:.1f} s after ready)"),
            entry,
            attempt.invocation,
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
            self._error(f"exporting the curves failed ({exc.message}); will try again next poll")
            return
        self.state.exported_through = through
        self.state.save()
        if message:
            self._emit("exported", message)


def _served_content(results: Any) -> str | None:
    """The content sha256 the server reported it loaded (results.json's provenance), if it reported one."""
    checkpoint = (results.provenance.checkpoint or {}) if results.provenance is not None else {}
    return checkpoint.get("files_sha256") if checkpoint.get("source") == "server" else None


def attempts_made(entry: IterationEntry) -> int:
    """The attempts that count towards `max_attempts` (an evaluation withdrawn by `watch stop --cancel` does not)."""
    return sum(1 for a in entry.attempts if a.state != "withdrawn")


def _is_score(key: str) -> bool:
    return not key.endswith(("_stderr", "/n_samples", "_std_dev"))


def _message(exc: BaseException) -> str:
    return exc.message if isinstance(exc, CkptevalError) else str(exc) or type(exc).__name__


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def _last_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1][:200] if lines else "no detail"
