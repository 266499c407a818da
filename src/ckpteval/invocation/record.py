"""Invocations: an id per `evaluate` run, and a typed local record so later commands find it.

Every invocation gets a short random id (8 hex digits; commands accept any unambiguous prefix). Its
record lives in `$XDG_STATE_HOME/ckpteval/invocations/<id>/`: `record.json` (an `InvocationRecord`:
where it runs, its tasks, what its executor keeps of the job (`placement`), the final status), `config.yaml`
(the compiled config, secrets redacted) and `job.yaml` (provenance). The record is written, atomically,
before anything is submitted.

Older records are read and converted: version 1 (core fields in an untyped `extra` dict) and version 2
(the executor's part in a field of its own); a record.json that is none of these says so in one line
(`ConfigError`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ckpteval.errors import ConfigError

if TYPE_CHECKING:
    from ckpteval.config.compile import CompiledConfig
    from ckpteval.config.compose import CompileRequest

STATE_DIR_VAR = "CKPTEVAL_STATE_DIR"
RECORD_FILE = "record.json"
RECORD_VERSION = 3
Executor = str  # a registered executor (`ckpteval.config.executors`)
P = TypeVar("P")


def state_dir() -> Path:
    """Where invocation records live ($CKPTEVAL_STATE_DIR or $XDG_STATE_HOME/ckpteval)."""
    explicit = os.environ.get(STATE_DIR_VAR)
    if explicit:
        return Path(explicit).expanduser()
    root = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(root) / "ckpteval"


def records_dir() -> Path:
    return state_dir() / "invocations"


def new_invocation_id() -> str:
    """A fresh invocation id: 8 random hex digits."""
    return secrets.token_hex(4)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class TaskEntry:
    """One task of the job: its name, its directory (relative to the job dir) and its repeats (0: greedy)."""

    name: str
    dir: str
    repeats: int = 0


@dataclass
class WatchOrigin:
    """An invocation `evaluate watch` submitted: which watch run, which iteration of the training, where."""

    run: str
    iteration: int
    iter_dir: str


@dataclass
class TaskStatus:
    name: str
    dir: str
    state: str
    done: int = 0
    total: int | None = None
    error: str = ""
    log: str = ""
    hint: str = ""
    docs: int | None = None
    docs_total: int | None = None


@dataclass
class FinalStatus:
    """The status of a job seen ended, kept so listing old invocations does not ask their cluster again."""

    job: str | None  # the attempt it belongs to (the executor's `attempt` when it was seen ended)
    state: str
    detail: str
    log_tail: str
    deployment: str
    finished: int | None
    tasks: list[TaskStatus]
    ended: str = ""  # when the job ended, as it wrote it (state/ended)
    others: dict[str, str] = field(default_factory=dict)  # the other roles' deployments (a judge's): role -> state


@dataclass
class InvocationRecord:
    """What a later `status`/`logs`/`cancel`/`results`/`resume` needs to find an invocation again."""

    id: str
    created: str
    mode: str  # local | run | batch
    profile: str
    executor: Executor
    job_dir: str  # absolute, where the job runs (another machine's path for an executor that runs there)
    tasks: list[TaskEntry]
    command_line: list[str] = field(default_factory=list)  # secrets redacted
    env_file: str | None = None
    model: str | None = None  # what results.json names: the checkpoint evaluated and the run's label
    label: str | None = None
    local_results_dir: str | None = None  # where this machine holds the results (fetched there from elsewhere)
    # what the executor keeps of the job (how to reach it again, its scheduler's ids, its process): a
    # dataclass the executor's backend owns; read back as JSON, typed again by `placement_as`
    placement: Any = None
    job_label: str = ""  # its latest attempt as its executor names it, for people ("Slurm job 1234")
    final: FinalStatus | None = None
    watch: WatchOrigin | None = None
    version: int = RECORD_VERSION

    @property
    def path(self) -> Path:
        return records_dir() / self.id

    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    @property
    def task_dirs(self) -> list[tuple[str, str]]:
        """(name, task dir) in run order."""
        return [(t.name, t.dir) for t in self.tasks]

    @property
    def where(self) -> str:
        """Where the job runs, in a word: the executor, and the profile when it has another name
        (`local`, `slurm:MY-CLUSTER`, `ssh:gpu-box`)."""
        return self.executor if self.profile == self.executor else f"{self.executor}:{self.profile}"

    def placement_as(self, cls: type[P]) -> P | None:
        """The executor's part of the record as its dataclass `cls` (typed once: changes to it are saved);
        None when there is none, or it is another dataclass's."""
        if self.placement is None or isinstance(self.placement, cls):
            return self.placement
        if not isinstance(self.placement, dict):
            return None  # typed already, as another executor's
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        try:
            typed = cls(**{k: v for k, v in self.placement.items() if k in known})
        except TypeError:
            return None  # it lacks what `cls` requires: another executor's
        self.placement = typed
        return typed

    def task(self, name: str) -> TaskEntry | None:
        return next((t for t in self.tasks if t.name == name), None)

    def save(self) -> None:
        """Write record.json atomically (temp file, then rename)."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path / RECORD_FILE, json.dumps(dataclasses.asdict(self), indent=2) + "\n")


def command_line(request: CompileRequest, redact: Any) -> list[str]:
    """The `evaluate` command line that makes `request`, every word redacted."""
    words = ["evaluate"]
    for config in request.configs:
        words += ["-c", config]
    if request.profile:
        words += ["--batch" if request.mode == "batch" else "--run", request.profile]
    for task in request.tasks:
        words += ["-t", task]
    words += list(request.overrides)
    return [redact(w) for w in words]


def new_record(
    compiled: CompiledConfig,
    invocation: str,
    *,
    executor: Executor,
    job_dir: str,
    tasks: list[TaskEntry],
    placement: Any = None,
) -> InvocationRecord:
    """The record of a new invocation, for every backend; secrets redacted the same way for all."""
    redact = compiled.secrets.redact
    return InvocationRecord(
        id=invocation,
        created=now_iso(),
        mode=compiled.mode,
        profile=compiled.profile.name,
        executor=executor,
        job_dir=job_dir,
        tasks=tasks,
        command_line=command_line(compiled.request, redact),
        env_file=str(compiled.env_file) if compiled.env_file else None,
        model=getattr(compiled.config.deployment, "checkpoint_path", None),
        label=compiled.config.run.name,
        placement=placement,
    )


def write_text_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write `text` to `path` through a temporary file in the same directory, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_record(ref: str) -> InvocationRecord:
    """The record whose id is `ref` or starts with it; unknown or ambiguous is a ConfigError."""
    base = records_dir()
    if not ref:
        raise ConfigError("No invocation id given.")
    candidates = sorted(p.name for p in base.glob(f"{ref}*") if (p / RECORD_FILE).is_file()) if base.is_dir() else []
    if not candidates:
        raise ConfigError(
            f"No invocation '{ref}' is recorded here ({base}).",
            hint="`evaluate status` lists the recorded invocations.",
        )
    if len(candidates) > 1 and ref not in candidates:
        raise ConfigError(
            f"'{ref}' matches several invocations: {', '.join(candidates)}.", hint="Give more characters of the id."
        )
    chosen = ref if ref in candidates else candidates[0]
    return read_record(base / chosen / RECORD_FILE)


def read_record(path: Path) -> InvocationRecord:
    """Read a record.json (either format); a damaged one is a ConfigError that names it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        version = data.get("version")
        if version == RECORD_VERSION:
            return record_from_json(data)
        return record_from_json(_from_v2(data if version == 2 else _from_v1(data)))
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(
            f"The invocation record {path} cannot be read: {exc}.",
            hint="It was damaged or written by another tool; remove its directory to forget the invocation.",
        ) from None


def record_from_json(data: dict[str, Any]) -> InvocationRecord:
    """An `InvocationRecord` from its JSON form (this version; `placement` stays JSON until typed)."""
    final = data.get("final")
    watch = data.get("watch")
    fields = {f.name for f in dataclasses.fields(InvocationRecord)}
    nested = ("tasks", "final", "watch")
    plain = {k: v for k, v in data.items() if k in fields and k not in nested}
    return InvocationRecord(
        **plain,
        tasks=[TaskEntry(**t) for t in data["tasks"]],
        final=(FinalStatus(**{**final, "tasks": [TaskStatus(**t) for t in final["tasks"]]}) if final else None),
        watch=WatchOrigin(**watch) if watch else None,
    )


# Version 2 kept the executor's part of the record in a field named after it.
_V2_PLACEMENT_FIELDS = ("slurm", "process")


def _from_v2(data: dict[str, Any]) -> dict[str, Any]:
    """A version-2 record in this version's shape: its executor's field becomes the placement."""
    placement = next((data[k] for k in _V2_PLACEMENT_FIELDS if data.get(k)), None)
    rest = {k: v for k, v in data.items() if k not in _V2_PLACEMENT_FIELDS}
    return {**rest, "placement": placement, "version": RECORD_VERSION}


def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A record written before version 2 (core fields under `extra`) in the version-2 shape."""
    extra = data.get("extra") or {}
    dirs = extra.get("task_dirs") or {}
    repeats = extra.get("task_repeats") or {}
    tasks = [{"name": n, "dir": dirs.get(n, f"tasks/{n}"), "repeats": int(repeats.get(n, 0))} for n in data["tasks"]]
    slurm = None
    if data.get("executor") == "slurm":
        job_ids = list(extra.get("slurm_job_ids") or ([data["slurm_job_id"]] if data.get("slurm_job_id") else []))
        slurm = {
            "connection": extra.get("connection") or {},
            "sbatch": extra.get("sbatch") or {},
            "job_ids": job_ids,
            "nemo_run_experiment": data.get("nemo_run_experiment"),
            "nemo_run_dir": extra.get("nemo_run_dir"),
            "submit_error": extra.get("submit_error"),
            "results_of_job": extra.get("results_of_job"),
        }
    final = extra.get("final")
    return {
        **{k: data.get(k) for k in ("id", "created", "mode", "profile", "executor", "job_dir", "env_file")},
        "command_line": data.get("command_line") or [],
        "local_results_dir": data.get("local_results_dir")
        or (data.get("job_dir") if data.get("executor") == "local" else None),
        "tasks": tasks,
        "model": extra.get("model"),
        "label": extra.get("label"),
        "slurm": slurm,
        "process": {"pid": extra["pid"], "start": extra.get("pid_start")} if extra.get("pid") else None,
        "final": final if isinstance(final, dict) else None,
        "version": 2,
    }


def list_records() -> list[InvocationRecord]:
    """Every recorded invocation, newest first (a record being written right now, or damaged, is left out)."""
    base = records_dir()
    if not base.is_dir():
        return []
    out = []
    for p in base.glob(f"*/{RECORD_FILE}"):
        try:
            out.append(read_record(p))
        except (OSError, ConfigError):
            continue
    return sorted(out, key=lambda r: r.created, reverse=True)
