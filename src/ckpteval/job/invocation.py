"""Invocations: an id per `evaluate` run, and a local record so later commands find it.

Every invocation gets a short random id (8 hex digits; commands accept any unambiguous prefix). Its
record lives in `$XDG_STATE_HOME/ckpteval/invocations/<id>/`: `record.json` (where it runs, where its
files are, the Slurm job id), `config.yaml` (the compiled config, secrets redacted) and `job.yaml`
(provenance: command line, profile, versions). The record is written before anything is submitted.
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
from typing import Any

from ckpteval.errors import ConfigError

STATE_DIR_VAR = "CKPTEVAL_STATE_DIR"


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


@dataclass
class InvocationRecord:
    """What a later `status`/`logs`/`cancel`/`results` needs to find an invocation again."""

    id: str
    created: str
    mode: str  # local | run | batch
    profile: str
    executor: str  # local | slurm
    job_dir: str  # absolute; on the cluster for slurm
    tasks: list[str]
    command_line: list[str] = field(default_factory=list)
    env_file: str | None = None
    slurm_job_id: str | None = None
    nemo_run_experiment: str | None = None
    local_results_dir: str | None = None  # where results were fetched to (slurm)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return records_dir() / self.id

    def save(self) -> None:
        """Write record.json atomically (temp file, then rename)."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path / "record.json", json.dumps(dataclasses.asdict(self), indent=2) + "\n")


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    candidates = sorted(p.name for p in base.glob(f"{ref}*") if (p / "record.json").is_file()) if base.is_dir() else []
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
    return read_record(base / chosen / "record.json")


def read_record(path: Path) -> InvocationRecord:
    data = json.loads(path.read_text(encoding="utf-8"))
    known = {f.name for f in dataclasses.fields(InvocationRecord)}
    return InvocationRecord(**{k: v for k, v in data.items() if k in known})


def list_records() -> list[InvocationRecord]:
    """Every recorded invocation, newest first."""
    base = records_dir()
    if not base.is_dir():
        return []
    out = []
    for p in base.glob("*/record.json"):
        try:
            out.append(read_record(p))
        except (OSError, ValueError, TypeError):
            continue  # a record being written right now, or damaged: not listable
    return sorted(out, key=lambda r: r.created, reverse=True)
