"""Start, inspect and stop a watch run (what `evaluate watch` calls; no printing here).

`open_watch` checks the config once (so a bad config fails before anything is watched), creates or
continues the run's state (the same command continues the same run), and returns a `Watcher` wired to
the save dir's listing (here, or over the profile's SSH: one round trip per poll), the pipeline seam
(`submit`) and the curves.
"""

from __future__ import annotations

import os
import posixpath
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.config.profiles import Profile
from ckpteval.errors import ConfigError
from ckpteval.watch import submit
from ckpteval.watch.loop import Watcher, WatchEvent
from ckpteval.watch.readiness import SaveDirListing, list_save_dir
from ckpteval.watch.state import (
    IterationEntry,
    WatchSpec,
    WatchState,
    load_state,
    process_alive,
    run_name,
    stop_file,
)
from ckpteval.watch.submit import EvaluationState


class SubmitPipeline:
    """The production pipeline: `ckpteval.watch.submit` for one watch run."""

    def __init__(self, spec: WatchSpec, run: str) -> None:
        self.spec, self.run = spec, run

    def submit(self, iteration: int, iter_dir: str) -> str:
        return submit.submit(self.spec, iteration, iter_dir, run=self.run)

    def state(self, invocation: str) -> EvaluationState:
        return submit.evaluation_state(invocation)


class SaveDirLister:
    """Lists the save dir where the profile's jobs see it: here, or on the cluster (one SSH round trip)."""

    def __init__(self, profile: Profile, save_dir: str) -> None:
        self.profile, self.save_dir = profile, save_dir
        self.round_trips = 0
        self._session: Any = None

    def __call__(self) -> SaveDirListing:
        self.round_trips += 1
        if self.profile.executor == "local" or self.profile.tunnel == "local":
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
    if profile.executor == "local" or profile.tunnel == "local":
        return str(Path(save_dir).expanduser().resolve())
    raise ConfigError(
        f"The save directory {save_dir!r} is on the cluster: give it as an absolute path there.",
        hint="e.g. evaluate watch /lustre/run42/checkpoints -c sft --run MY-CLUSTER",
    )


def resolve_profile(spec: WatchSpec) -> Profile:
    """The profile the evaluations run on (and where the save dir is listed)."""
    from ckpteval.config.profiles import load_env_file

    return load_env_file(Path(spec.env_file) if spec.env_file else None).profile(spec.profile)


DEFAULT_MAX_PENDING = {"slurm": 4, "local": 1}


def _resolve(spec: WatchSpec) -> Profile:
    """Check the spec's numbers, make its save dir absolute and its max pending concrete; its profile."""
    if spec.max_pending < 0 or spec.max_attempts < 1 or spec.every <= 0:
        raise ConfigError("--max-pending and --max-attempts must be at least 1, --every above 0.")
    profile = resolve_profile(spec)
    spec.save_dir = absolute_save_dir(spec.save_dir, profile)
    spec.max_pending = spec.max_pending or DEFAULT_MAX_PENDING[profile.executor]
    return profile


def open_watch(spec: WatchSpec, *, on_event: Callable[[WatchEvent], None] = lambda _e: None) -> Watcher:
    """The watcher of `spec` (its state created, or continued from the last run of the same command)."""
    profile = _resolve(spec)
    run = run_name(spec.save_dir, spec.profile)
    export = submit.export_settings(spec, run=run)  # compiles the config once: bad input fails here
    state = load_state(run)
    if state is None:
        state = WatchState(run=run, spec=spec, created=time.time())
    else:
        state.spec = spec  # the options of this start apply from now on; what was done stays done
    lister = SaveDirLister(profile, spec.save_dir)

    def exporter(st: WatchState, entries: list[IterationEntry]) -> str | None:
        from ckpteval.watch.curves import export_curves

        return export_curves(st, entries, export)

    watcher = Watcher(state, lister=lister, pipeline=SubmitPipeline(spec, run), on_event=on_event, exporter=exporter)
    return watcher


@dataclass(frozen=True)
class DryRun:
    """What `--dry-run` shows: the listing, what would be evaluated now, and the job of the first one."""

    run: str
    listing: SaveDirListing
    would_evaluate: list[int]
    already: dict[int, str]  # iteration -> its recorded state
    preview: tuple[Any, str, list[Any]] | None  # (compiled, invocation, panels) of the first to evaluate


def dry_run(spec: WatchSpec) -> DryRun:
    """List the save dir and say what a watcher would submit now; submits nothing, writes nothing."""
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
    preview = submit.preview(spec, first.iteration, first.path, run=run) if first else None
    if first is None:
        submit.export_settings(spec, run=run)  # still check the config
    return DryRun(run=run, listing=listing, would_evaluate=todo, already=done, preview=preview)


def request_stop(run: str) -> str:
    """Ask the run's watcher to stop (a stop file, and SIGTERM to its process); evaluations in flight go on."""
    from ckpteval.watch.state import find_run

    state = find_run(run)
    if not process_alive(state.pid, state.pid_start):
        return f"no watcher of {state.run} is running (nothing to stop)"
    assert state.pid is not None
    stop_file(state.run).write_text(str(time.time()))
    os.kill(state.pid, signal.SIGTERM)
    for _ in range(100):
        if not process_alive(state.pid, state.pid_start):
            break
        time.sleep(0.1)
    return f"stopped the watcher of {state.run} (process {state.pid}); evaluations already submitted go on"
