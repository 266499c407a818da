"""A watch run's record: what it watches, and per iteration what was done (survives restarts).

`$CKPTEVAL_STATE_DIR/watch/<run>/state.json`, rewritten atomically after every change, so a watcher that
is killed and started again (the same command) knows what it submitted, what finished and what failed:
it evaluates nothing twice and misses nothing. A lock file beside it keeps a second watcher of the same
run from running at the same time; a `stop` file asks a running watcher to end.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import fcntl
import hashlib
import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from ckpteval.errors import ConfigError
from ckpteval.invocation.record import state_dir, write_text_atomic

# waiting: ready, not submitted yet (no free slot); submitted: an evaluation is queued or running;
# succeeded: its scores are in; retry: the last attempt failed, another one is due; failed: every attempt
# failed (reported, never retried again); skipped: --policy latest moved on to a newer checkpoint
EntryState = Literal["waiting", "submitted", "succeeded", "retry", "failed", "skipped"]
Policy = Literal["all", "latest"]
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
KEPT_ERRORS = 20


@dataclass
class Attempt:
    """One evaluation of a checkpoint."""

    invocation: str  # chosen before the submission, so a restarted watcher can find what it submitted
    submitted_at: float
    # submitting: the intent, saved before the submission is made (a restart adopts or drops it);
    # submitted; then the invocation's final state: succeeded | failed | cancelled; withdrawn: cancelled
    # by `watch stop --cancel` (not a failed attempt: the checkpoint is evaluated again by the next watcher)
    state: str = "submitted"
    ended_at: float | None = None
    error: str | None = None
    status_errors: int = 0  # status queries in a row that got no answer (reset by an answer)


@dataclass
class IterationEntry:
    """What the watcher did with one iteration."""

    iteration: int
    path: str
    state: EntryState
    first_seen_ready: float  # when a listing first found it complete (latency is measured from here)
    attempts: list[Attempt] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # "<task>/<metric>[_stderr]" -> value
    note: str = ""
    # "previous" / "best" -> the paired comparison of each task metric with that checkpoint (`watch.verdicts`)
    verdicts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    save: str = ""  # the listing's signature of the save evaluated (`watch.readiness.CheckpointStatus.save`)
    content: str | None = None  # the content sha256 the server reported it loaded (results.json's checkpoint)
    # what its evaluations cost, summed over every attempt that reported it (results.json's `usage`): gpu_hours,
    # wall_seconds, cpu_seconds, attempts (how many were counted), kept (its checkpoint was loaded in place)
    usage: dict[str, Any] = field(default_factory=dict)

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None


@dataclass
class WatchSpec:
    """What is watched and how it is evaluated (from the command line; fixed for the run)."""

    save_dir: str
    configs: list[str]
    profile: str | None
    tasks: list[str]
    overrides: list[str]
    env_file: str | None = None
    every: float = 300.0
    policy: Policy = "all"
    max_pending: int = 0  # 0: the default for where it runs (Slurm 4, this machine 1)
    max_attempts: int = 3
    wandb_run_id: str | None = None
    follow_every: float = 0.0  # seconds between two status queries of an evaluation in flight (0: here 5, Slurm 30)
    eval_timeout: float | None = None  # seconds an evaluation may take from submission; None: from the config
    status_error_limit: int = 20  # status queries in a row without an answer before the attempt counts as failed
    fresh_deployments: bool = False  # a fresh deployment per checkpoint even where one could be kept (`watch.kept`)


@dataclass
class WatchState:
    """The run's record on disk."""

    run: str
    spec: WatchSpec
    created: float
    iterations: dict[int, IterationEntry] = field(default_factory=dict)
    # earlier saves of iterations a restarted or rolled-back training rewrote (evaluated again since)
    rewritten: list[IterationEntry] = field(default_factory=list)
    exported_through: int = -1  # every iteration <= this one is in the curves (W&B/MLflow steps only grow)
    pid: int | None = None
    pid_start: str | None = None
    polls: int = 0
    last_poll: float | None = None
    next_poll: float | None = None
    last_follow: float | None = None  # the last status query of the evaluations in flight
    last_error: str | None = None
    errors: list[str] = field(default_factory=list)  # the latest errors, newest last ("HH:MM:SS what")
    host: str | None = None  # where the watcher process runs (pid/pid_start are of that host)
    watcher_since: float | None = None  # when the running (or last) watcher started

    def save(self) -> None:
        write_text_atomic(state_file(self.run), json.dumps(state_to_json(self), indent=2) + "\n")

    def in_flight(self) -> list[IterationEntry]:
        return [e for e in self.iterations.values() if e.state == "submitted"]

    def note_error(self, message: str, *, at: float) -> None:
        """Remember an error for `watch status` (the latest `KEPT_ERRORS` of them)."""
        import time

        self.last_error = message
        self.errors = [*self.errors, f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(at))} {message}"]
        del self.errors[:-KEPT_ERRORS]


def watch_dir() -> Path:
    return state_dir() / "watch"


def state_file(run: str) -> Path:
    return watch_dir() / run / "state.json"


def stop_file(run: str) -> Path:
    return watch_dir() / run / "stop"


def run_name(save_dir: str, profile: str | None) -> str:
    """The run's name: the training run's directory name and a hash of where it is (same dir, same run).

    `/lustre/run42/checkpoints` on profile `eos` -> `run42-3fa2c1`, so starting the same watch command again
    continues the same run.
    """
    norm = posixpath.normpath(save_dir)
    base = posixpath.basename(norm)
    if base in ("checkpoints", "checkpoint", "ckpt", "ckpts", "save", "saves") and posixpath.dirname(norm) != "/":
        base = posixpath.basename(posixpath.dirname(norm))
    digest = hashlib.sha256(f"{profile or 'local'}:{norm}".encode()).hexdigest()[:6]
    return f"{_UNSAFE.sub('-', base).strip('-')[:40] or 'watch'}-{digest}"


def load_state(run: str) -> WatchState | None:
    """The recorded run, or None when there is none yet."""
    path = state_file(run)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"The watch state {path} cannot be read: {exc}", hint="Move it away to start over.") from None
    return _from_json(data)


def find_run(ref: str) -> WatchState:
    """The watch run named `ref` (or the only one starting with it); unknown or ambiguous is a ConfigError."""
    base = watch_dir()
    names = sorted(p.parent.name for p in base.glob("*/state.json")) if base.is_dir() else []
    matches = [n for n in names if n == ref] or [n for n in names if n.startswith(ref)]
    if len(matches) != 1:
        what = "matches several watch runs" if matches else "is not a watch run recorded here"
        raise ConfigError(
            f"'{ref}' {what} ({base}).",
            hint=("Watch runs: " + ", ".join(names)) if names else "Start one with `evaluate watch DIR -c CONFIG`.",
        )
    state = load_state(matches[0])
    assert state is not None
    return state


def list_runs() -> list[WatchState]:
    """Every recorded watch run, newest first."""
    base = watch_dir()
    runs = [load_state(p.parent.name) for p in base.glob("*/state.json")] if base.is_dir() else []
    return sorted((r for r in runs if r is not None), key=lambda r: r.created, reverse=True)


class RunLock:
    """An exclusive lock on a watch run: one watcher per run at a time (released when the process dies)."""

    def __init__(self, run: str) -> None:
        self.path = watch_dir() / run / "lock"
        self._handle: IO[str] | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a")  # held for the watcher's lifetime
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise ConfigError(
                f"Another watcher is running watch run {self.path.parent.name}.",
                hint=f"`evaluate watch status {self.path.parent.name}` shows it; "
                f"`evaluate watch stop {self.path.parent.name}` ends it.",
            ) from None
        self._handle = handle
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()


def lock_held(run: str) -> bool:
    """Whether a watcher of `run` holds its lock now (it is starting, running or stopping)."""
    path = watch_dir() / run / "lock"
    if not path.exists():
        return False
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def stop_requested(run: str, *, since: float) -> bool:
    """Whether a stop was asked for the watcher that started at `since` (a stop file written after that;
    an older one, left by a stop its watcher never read, is not this watcher's)."""
    path = stop_file(run)
    try:
        written = float(path.read_text(encoding="utf-8").strip() or 0)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True  # a stop file that cannot be read still asks for a stop
    return written >= since


def state_to_json(state: WatchState) -> dict[str, Any]:
    """The state as JSON data (iterations keyed by their number as text)."""
    data = dataclasses.asdict(state)
    data["iterations"] = {str(k): v for k, v in data["iterations"].items()}
    return data


def _from_json(data: dict[str, Any]) -> WatchState:
    spec = WatchSpec(**data["spec"])
    iterations = {}
    for key, raw in (data.get("iterations") or {}).items():
        attempts = [Attempt(**a) for a in raw.pop("attempts", [])]
        iterations[int(key)] = IterationEntry(**raw, attempts=attempts)
    rewritten = [
        IterationEntry(**{**raw, "attempts": [Attempt(**a) for a in raw.get("attempts") or []]})
        for raw in data.get("rewritten") or []
    ]
    fields = {f.name for f in dataclasses.fields(WatchState)} - {"spec", "iterations", "rewritten"}
    return WatchState(
        spec=spec, iterations=iterations, rewritten=rewritten, **{k: v for k, v in data.items() if k in fields}
    )


def process_alive(pid: int | None, started: str | None) -> bool:
    """Whether the watcher process `pid` still runs (and is the one that started at `started`)."""
    from ckpteval.execution.processes import process_start_time

    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = process_start_time(pid)
    return now is not None and (started is None or now == started)
