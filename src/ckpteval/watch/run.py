"""Start, inspect and stop a watch run (what `evaluate watch` calls; no printing here).

`watch` is the whole life of a watcher (what `evaluate watch` runs): stop handling first, then the lock,
the state, the loop, and an outcome. `open_watch` checks the config once (so a bad config fails before
anything is watched), takes the run's lock, creates or continues the run's state (the same command
continues the same run), and returns a `Watcher` wired to the save dir's listing (here, or over the
profile's SSH: one round trip per poll), the pipeline seam (`submit`), the verdicts and the curves.
`request_stop` ends a running watcher and waits for it.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import contextlib
import dataclasses
import os
import posixpath
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.config.profiles import Profile
from ckpteval.errors import ConfigError
from ckpteval.execution.processes import process_start_time
from ckpteval.watch import submit
from ckpteval.watch.kept import KeepDecision, KeptDeployment, keep_decision

if TYPE_CHECKING:
    from ckpteval.watch.kept import KeptJob
from ckpteval.watch.loop import Watcher, WatchEvent
from ckpteval.watch.readiness import SaveDirListing, list_save_dir
from ckpteval.watch.state import (
    IterationEntry,
    RunLock,
    WatchSpec,
    WatchState,
    find_run,
    load_state,
    lock_held,
    process_alive,
    run_name,
    stop_file,
)
from ckpteval.watch.submit import EvaluationState


class SubmitPipeline:
    """The production pipeline: `ckpteval.watch.submit` for one watch run (library calls only); with `kept`, each
    checkpoint that fits is loaded into the run's kept deployment (`watch.kept`), the others get a fresh one."""

    def __init__(
        self,
        spec: WatchSpec,
        run: str,
        *,
        kept: KeptDeployment | KeptJob | None = None,
        on_event: Callable[[WatchEvent], None] = lambda _e: None,
    ) -> None:
        self.spec, self.run, self.kept, self.on_event = spec, run, kept, on_event

    def submit(self, iteration: int, iter_dir: str, invocation: str) -> str:
        load_into = None
        if self.kept is not None:
            placement = self.kept.place(iteration, iter_dir)
            if placement.note:
                self.on_event(WatchEvent("deployment", placement.note, iteration))
            load_into = placement.load_into
        return submit.submit(self.spec, iteration, iter_dir, run=self.run, invocation=invocation, load_into=load_into)

    def adopt(self, iteration: int, iter_dir: str, invocation: str) -> bool:
        return submit.adopt(invocation, run=self.run, iteration=iteration, iter_dir=iter_dir)

    def state(self, invocation: str) -> EvaluationState:
        return submit.evaluation_state(invocation)

    def cancel(self, invocation: str) -> str:
        return submit.cancel(invocation)


class SaveDirLister:
    """Lists the save dir where the profile's jobs see it: here, or on the cluster (one SSH round trip)."""

    def __init__(self, profile: Profile, save_dir: str) -> None:
        self.profile, self.save_dir = profile, save_dir
        self.round_trips = 0
        self._session: Any = None

    def __call__(self) -> SaveDirListing:
        self.round_trips += 1
        if runs_here(self.profile):
            from ckpteval.cluster.remote import LocalRemote

            return list_save_dir(LocalRemote(), self.save_dir)
        if self._session is None:
            from ckpteval.cluster.session import ClusterSession

            self._session = ClusterSession(self.profile)
        return self._session.call(lambda remote: list_save_dir(remote, self.save_dir))

    def close(self) -> None:
        if self._session is not None:
            self._session.close()


def absolute_save_dir(save_dir: str, profile: Profile) -> str:
    """The save dir as an absolute path: relative ones are relative to here (only for local profiles)."""
    if save_dir.startswith("/"):
        return posixpath.normpath(save_dir)
    if runs_here(profile):
        return str(Path(save_dir).expanduser().resolve())
    raise ConfigError(
        f"The save directory {save_dir!r} is on the cluster: give it as an absolute path there.",
        hint="e.g. evaluate watch /lustre/run42/checkpoints -c sft --run MY-CLUSTER",
    )


def resolve_profile(spec: WatchSpec) -> Profile:
    """The profile the evaluations run on (and where the save dir is listed)."""
    from ckpteval.config.profiles import load_env_file

    return load_env_file(Path(spec.env_file) if spec.env_file else None).profile(spec.profile)


def runs_here(profile: Profile) -> bool:
    """Whether the profile's files (the save dir) are on this machine: its executor's jobs run here, or this
    is the cluster's login node (`tunnel = "local"`)."""
    from ckpteval.config.executors import find_executor

    return not find_executor(profile.executor).on_cluster or profile.part.files_here()


def jobs_run_here(profile: Profile) -> bool:
    """Whether the profile's evaluation jobs run on this machine (where a kept deployment would run): not on a
    cluster's compute nodes, even for a watcher on the cluster's login node."""
    from ckpteval.config.executors import find_executor

    return not find_executor(profile.executor).on_cluster


def kept_job_backend(profile: Profile) -> Any:
    """The backend of the profile's executor where it keeps one job across a watch run's checkpoints (its
    `kept_job`: on Slurm, `execution.slurm_kept`) and those jobs run elsewhere; None otherwise."""
    from ckpteval.execution.backends import backend_for

    if jobs_run_here(profile):
        return None
    backend = backend_for(profile.executor)
    return backend if hasattr(backend, "kept_job") else None


def _decide(spec: WatchSpec, config: Any, profile: Profile, *, pending_given: bool) -> KeepDecision:
    """`keep_decision` for the profile; on Slurm, without --max-pending, one evaluation at a time when that
    keeps one job (the kept job evaluates one checkpoint at a time), the executor's default otherwise."""
    backend = kept_job_backend(profile)
    refusal = backend.kept_job_refusal() if backend is not None else ""
    if refusal and not spec.fresh_deployments:
        return KeepDecision(False, refusal)
    here, in_job = jobs_run_here(profile), backend is not None
    if in_job and not pending_given and spec.max_pending > 1:
        single = keep_decision(dataclasses.replace(spec, max_pending=1), config, here=here, in_kept_job=in_job)
        if single.keep:
            spec.max_pending = 1
            return single
    return keep_decision(spec, config, here=here, in_kept_job=in_job)


def _kept(
    decision: KeepDecision,
    spec: WatchSpec,
    config: Any,
    run: str,
    profile: Profile,
    on_event: Callable[[WatchEvent], None],
) -> KeptDeployment | KeptJob | None:
    """The run's kept deployment (here) or kept Slurm job, when `decision` keeps one."""
    if not decision.keep:
        return None

    def compile_first(iteration: int, iter_dir: str) -> Any:
        return submit.compile_evaluation(spec, iteration, iter_dir, run=run)

    backend = kept_job_backend(profile)
    if backend is not None:
        kept: KeptJob = backend.kept_job(
            run, profile, compile_first, on_note=lambda m, i: on_event(WatchEvent("deployment", m, i))
        )
        return kept
    from ckpteval.deploy.backends import backend_for

    if backend_for(config.deployment).kind == "sglang":  # its export of each checkpoint, by /update_weights_from_disk
        from ckpteval.watch.kept_sglang import KeptSglang

        return KeptSglang(run, compile_first)
    return KeptDeployment(run, compile_first)


def _resolve(spec: WatchSpec) -> Profile:
    """Check the spec's numbers, make its save dir absolute and its max pending concrete; its profile."""
    if spec.max_pending < 0 or spec.max_attempts < 1 or spec.every <= 0 or spec.follow_every < 0:
        raise ConfigError("--max-pending and --max-attempts must be at least 1, --every and --follow-every above 0.")
    profile = resolve_profile(spec)
    spec.save_dir = absolute_save_dir(spec.save_dir, profile)
    from ckpteval.config.executors import find_executor

    executor = find_executor(profile.executor)
    spec.max_pending = spec.max_pending or executor.watch_max_pending
    spec.follow_every = spec.follow_every or executor.watch_follow_every
    return profile


class OpenWatch(Watcher):
    """A watcher that holds its run's lock (one watcher per run) until `close()`."""

    lock: RunLock
    lister: SaveDirLister
    kept: KeptDeployment | KeptJob | None = None

    def close(self) -> None:
        """Stop the kept deployment, release the lock and the save dir's connection (the state stays as it was
        last saved). With an evaluation in flight (a watcher stopped mid-way) the kept deployment is left serving
        it; the next watcher, or `watch stop --cancel`, stops it."""
        try:
            if not self.state.in_flight():
                if self.kept is not None:
                    self.kept.stop()
                _leftover(self.state.run, self.state.spec)  # one an earlier watcher left serving
        finally:
            self.lister.close()
            self.lock.__exit__(None, None, None)


def open_watch(spec: WatchSpec, *, on_event: Callable[[WatchEvent], None] = lambda _e: None) -> OpenWatch:
    """The watcher of `spec`, holding the run's lock: its state created, or continued from the last run of
    the same command. The lock is taken before the state is read, so two watchers of one run never act on
    the same state (the second gets a ConfigError); `close()` releases it."""
    pending_given = spec.max_pending > 0
    profile = _resolve(spec)
    run = run_name(spec.save_dir, spec.profile)
    settings = submit.watch_settings(spec, run=run)  # compiles the config once: bad input fails here
    decision = _decide(spec, settings.config, profile, pending_given=pending_given)
    spec.eval_timeout = settings.eval_timeout
    lock = RunLock(run).__enter__()
    try:
        state = load_state(run)
    except BaseException:
        lock.__exit__(None, None, None)
        raise
    if state is None:
        state = WatchState(run=run, spec=spec, created=time.time())
    else:
        state.spec = spec  # the options of this start apply from now on; what was done stays done
    lister = SaveDirLister(profile, spec.save_dir)
    on_event(WatchEvent("deployment", decision.line))
    kept = _kept(decision, spec, settings.config, run, profile, on_event)

    def exporter(st: WatchState, entries: list[IterationEntry]) -> str | None:
        from ckpteval.watch.curves import export_curves

        return export_curves(st, entries, settings.export)

    def judge(st: WatchState, entry: IterationEntry) -> None:
        from ckpteval.watch.verdicts import judge as compare_with_earlier

        compare_with_earlier(st, entry)

    watcher = OpenWatch(
        state,
        lister=lister,
        pipeline=SubmitPipeline(spec, run, kept=kept, on_event=on_event),
        on_event=on_event,
        exporter=exporter,
        judge=judge,
    )
    watcher.lock = lock
    watcher.kept = kept
    return watcher


@dataclass(frozen=True)
class WatchOutcome:
    """How a watcher ended: `stopped` (asked to) or `done` (--once); what was left open or failed."""

    run: str
    ended: str  # done | stopped
    succeeded: list[int]
    failed: list[int]
    unfinished: list[int]  # waiting, submitted or to retry when it ended

    @property
    def exit_status(self) -> int:
        """0 when everything it took on succeeded (or was skipped); 1 when something failed or, --once, is
        not finished."""
        return 1 if self.failed or (self.ended == "done" and self.unfinished) else 0


def watch(
    spec: WatchSpec,
    *,
    once: bool = False,
    on_event: Callable[[WatchEvent], None] = lambda _e: None,
    on_start: Callable[[Watcher], None] = lambda _w: None,
) -> WatchOutcome:
    """Run a watcher until it is stopped (`request_stop`, SIGTERM) or, `once`, until what is ready now is done.

    In this order, so that no stop is lost: SIGTERM is caught (from the start), the run's lock is taken,
    its state read, this process recorded as its watcher; a stop asked at any point from then on (SIGTERM,
    or the stop file `request_stop` writes) ends it at its next check. Evaluations in flight go on.
    """
    started = time.time()
    asked = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda _signum, _frame: asked.set())
    try:
        watcher = open_watch(spec, on_event=on_event)
        try:
            watcher.started = started
            state = watcher.state
            state.pid, state.pid_start, state.host = os.getpid(), process_start_time(os.getpid()), socket.gethostname()
            state.watcher_since = started
            state.save()
            on_start(watcher)
            ended = watcher.run(once=once, should_stop=asked.is_set)
        finally:
            watcher.state.pid = None
            watcher.state.next_poll = None
            watcher.state.save()
            if watcher.stop_asked():
                stop_file(watcher.state.run).unlink(missing_ok=True)  # honoured: not for the next watcher
            watcher.close()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    by_state = {s: sorted(i for i, e in state.iterations.items() if e.state == s) for s in ("succeeded", "failed")}
    unfinished = sorted(e.iteration for e in watcher.pending())
    return WatchOutcome(state.run, ended, by_state["succeeded"], by_state["failed"], unfinished)


@dataclass(frozen=True)
class DryRun:
    """What `--dry-run` shows: the listing, what would be evaluated now, and the job of the first one."""

    run: str
    listing: SaveDirListing
    would_evaluate: list[int]
    already: dict[int, str]  # iteration -> its recorded state
    preview: tuple[Any, str, list[Any]] | None  # (compiled, invocation, panels) of the first to evaluate
    deployment: KeepDecision | None = None  # whether one deployment is kept across checkpoints, and why (not)


def dry_run(spec: WatchSpec) -> DryRun:
    """List the save dir and say what a watcher would submit now; submits nothing, writes nothing."""
    pending_given = spec.max_pending > 0
    profile = _resolve(spec)
    run = run_name(spec.save_dir, spec.profile)
    lister = SaveDirLister(profile, spec.save_dir)
    try:
        listing = lister()
    finally:
        lister.close()
    state = load_state(run)
    done: dict[int, str] = {i: e.state for i, e in (state.iterations.items() if state else [])}
    todo = [c.iteration for c in listing.ready if c.iteration not in done or done[c.iteration] in ("waiting", "retry")]
    if spec.policy == "latest":
        todo = todo[-1:]
    first = next((c for c in listing.ready if todo and c.iteration == todo[0]), None)
    settings = submit.watch_settings(spec, run=run)  # checks the config even with nothing to evaluate
    decision = _decide(spec, settings.config, profile, pending_given=pending_given)
    load_into = None
    backend = kept_job_backend(profile)
    if decision.keep and backend is not None:
        load_into = backend.kept_job(run, profile, None).first_directory  # made when the kept job is submitted
    elif decision.keep:
        load_into = str(KeptDeployment(run, None).directory)
    preview = submit.preview(spec, first.iteration, first.path, run=run, load_into=load_into) if first else None
    return DryRun(run=run, listing=listing, would_evaluate=todo, already=done, preview=preview, deployment=decision)


@dataclass(frozen=True)
class InFlight:
    """An evaluation in flight, as `watch status` shows it."""

    iteration: int
    invocation: str
    state: str
    age_s: float
    status_errors: int


@dataclass(frozen=True)
class Health:
    """Is the run's watcher doing its job? (`watch status RUN`)"""

    alive: bool
    pid: int | None
    host: str | None
    since: float | None
    last_poll: float | None
    next_poll: float | None
    last_follow: float | None
    overdue: bool  # alive, but its next poll is well past: it is stuck somewhere
    in_flight: list[InFlight]
    errors: list[str]


def health(state: WatchState, *, now: float | None = None) -> Health:
    """The watcher's health from its state (and whether its recorded process still runs on this host)."""
    now = time.time() if now is None else now
    here = state.host in (None, socket.gethostname())
    alive = here and process_alive(state.pid, state.pid_start)
    grace = max(60.0, 3 * state.spec.follow_every)
    overdue = alive and state.next_poll is not None and now > state.next_poll + grace
    in_flight = [
        InFlight(
            e.iteration, e.current.invocation, e.current.state, now - e.current.submitted_at, e.current.status_errors
        )
        for e in sorted(state.in_flight(), key=lambda e: e.iteration)
        if e.current is not None
    ]
    return Health(
        alive=alive,
        pid=state.pid if alive else None,
        host=state.host,
        since=state.watcher_since,
        last_poll=state.last_poll,
        next_poll=state.next_poll if alive else None,
        last_follow=state.last_follow,
        overdue=overdue,
        in_flight=in_flight,
        errors=list(state.errors[-5:]),
    )


@dataclass(frozen=True)
class StopResult:
    """What `request_stop` did: `stopped` is False when a watcher was asked but still ran at the deadline."""

    message: str
    stopped: bool


def request_stop(run: str, *, timeout: float = 60.0, cancel: bool = False, pipeline: Any = None) -> StopResult:
    """Ask the run's watcher to stop (a stop file it checks, and SIGTERM to its process) and wait up to
    `timeout` seconds for it to end (its lock released). Evaluations in flight go on, unless `cancel`: then,
    once the watcher has ended, each is cancelled (`ckpteval.cancel`) and waited for until it has ended,
    within the same `timeout`.

    A watcher still starting (its lock taken, its pid not yet recorded) reads the stop file when it starts
    polling; a stop file is only written while a watcher holds the lock, so none is left for the next one."""
    state = find_run(run)
    deadline = time.monotonic() + timeout
    if not lock_held(state.run):
        stop_file(state.run).unlink(missing_ok=True)
        message = f"no watcher of {state.run} is running"
        if not cancel:
            return StopResult(message + " (nothing to stop)", stopped=True)
        return _withdraw(state, message, deadline=deadline, timeout=timeout, pipeline=pipeline)
    stop_file(state.run).write_text(f"{time.time()}\n")
    state = find_run(state.run)  # the pid, if the watcher recorded it since
    pid, pid_start = state.pid, state.pid_start
    if process_alive(pid, pid_start) and pid != os.getpid():  # in the watcher's own process: its stop file
        assert pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    who = f"process {pid}" if pid else "a watcher starting"
    while time.monotonic() < deadline:
        # ended: its lock released and, where its process is known, that process gone
        if not lock_held(state.run) and not (pid and pid != os.getpid() and process_alive(pid, pid_start)):
            message = f"stopped the watcher of {state.run} ({who})"
            if not cancel:
                return StopResult(message + "; evaluations already submitted go on", stopped=True)
            return _withdraw(state, message, deadline=deadline, timeout=timeout, pipeline=pipeline)
        time.sleep(0.1)
    return StopResult(
        f"asked the watcher of {state.run} ({who}) to stop, but it still runs after {timeout:g} s; "
        f"it stops at its next check (`evaluate watch status {state.run}` shows it)",
        stopped=False,
    )


def _leftover(run: str, spec: WatchSpec) -> None:
    """Stop the kept deployment (or kept Slurm jobs) of `run` an earlier watcher left serving."""
    from ckpteval.errors import CkptevalError

    KeptDeployment(run, None).stop_leftover()
    try:
        profile = resolve_profile(spec)
    except CkptevalError:
        return
    backend = kept_job_backend(profile)
    if backend is not None:
        backend.kept_job(run, profile, None).stop_leftover()


def _withdraw(state: WatchState, stopped: str, *, deadline: float, timeout: float, pipeline: Any) -> StopResult:
    """`watch stop --cancel` once no watcher runs: cancel every evaluation the run has in flight and wait
    until each has ended (its job, server and clients gone: its status final), holding the run's lock so
    no watcher starts meanwhile. A withdrawn evaluation is not a failed attempt: the next watcher evaluates
    its checkpoint again. One that ended on its own meanwhile stays, for the next watcher to collect."""
    from ckpteval.errors import CkptevalError
    from ckpteval.watch.loop import attempts_made

    with RunLock(state.run):
        current = load_state(state.run)
        assert current is not None
        pipeline = pipeline or SubmitPipeline(current.spec, current.run)
        cancelled: list[tuple[IterationEntry, str]] = []
        problems: list[str] = []
        for entry in sorted(current.in_flight(), key=lambda e: e.iteration):
            attempt = entry.current
            assert attempt is not None
            if attempt.state == "submitting" and not pipeline.adopt(entry.iteration, entry.path, attempt.invocation):
                entry.attempts.pop()  # an intent never submitted: nothing runs
                entry.state = "retry" if entry.attempts else "waiting"
                continue
            try:
                pipeline.cancel(attempt.invocation)
            except (CkptevalError, OSError) as exc:
                problems.append(f"iteration {entry.iteration}: cancelling {attempt.invocation} failed ({exc})")
                continue
            cancelled.append((entry, attempt.invocation))
        waiting = list(cancelled)
        while waiting and time.monotonic() < deadline:
            still = []
            for entry, invocation in waiting:
                try:
                    now = pipeline.state(invocation)
                except (CkptevalError, OSError):
                    still.append((entry, invocation))
                    continue
                if not now.finished:
                    still.append((entry, invocation))
                elif now.state != "succeeded":
                    attempt = entry.current
                    assert attempt is not None
                    attempt.state, attempt.ended_at = "withdrawn", time.time()
                    attempt.error = "cancelled by `evaluate watch stop --cancel`"
                    entry.state = "retry" if attempts_made(entry) else "waiting"
                # else: it finished first; the next watcher collects its scores
            waiting = still
            if waiting:
                time.sleep(0.2)
        current.save()
        _leftover(state.run, current.spec)  # what a watcher stopped mid-evaluation left serving
    if waiting:
        problems.append(
            f"still running after {timeout:g} s: " + ", ".join(f"{inv} (iteration {e.iteration})" for e, inv in waiting)
        )
    names = ", ".join(f"{inv} (iteration {e.iteration})" for e, inv in cancelled) or "none in flight"
    if problems:
        return StopResult(f"{stopped}; cancelled: {names}; but " + "; ".join(problems), stopped=False)
    return StopResult(f"{stopped}; cancelled its evaluations: {names}", stopped=True)
