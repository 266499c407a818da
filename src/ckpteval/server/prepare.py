"""Prepare a packaged model as a Megatron checkpoint, once, atomically (stdlib only in this process).

The heavy work (transformers, megatron, the forking checkpoint writer) runs in a child process
(`python -m ckpteval.server build-packaged NAME DIR`) writing into a temporary directory beside
the output; the directory is renamed into place only when complete. A manifest in it records what
was prepared from which source, so a second call finds a complete, matching checkpoint and returns
at once. A lock file serialises concurrent preparations of the same output (two evaluation jobs
starting together).
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, get_args

from ckpteval.checkpoint.layout import TRACKER_FILE, locate_checkpoint
from ckpteval.errors import DeploymentError

PackagedModel = Literal["smollm2", "tiny"]
PACKAGED_MODELS: tuple[str, ...] = get_args(PackagedModel)
MANIFEST_FILE = "ckpteval_prepared.json"
RECIPE_VERSION = 1  # bump when a builder's output changes, to invalidate caches


def default_checkpoint_dir(name: str) -> Path:
    """Where a packaged model is cached by default: $XDG_CACHE_HOME/ckpteval/checkpoints/<name>."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "ckpteval" / "checkpoints" / name


def _check_name(name: str) -> None:
    if name not in PACKAGED_MODELS:
        raise DeploymentError(
            f"Unknown packaged model {name!r}.", hint=f"Packaged models: {', '.join(PACKAGED_MODELS)}."
        )


def _manifest(name: str) -> dict[str, object]:
    from ckpteval.server.packaged import source_of  # stdlib-only at import time

    return {"name": name, "recipe": RECIPE_VERSION, "source": source_of(name)}


def is_prepared(path: Path, name: str) -> bool:
    """Whether `path` holds a complete checkpoint of `name` prepared from the current source."""
    try:
        recorded = json.loads((path / MANIFEST_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if recorded != _manifest(name):
        return False
    try:
        layout = locate_checkpoint(path)
    except DeploymentError:
        return False
    return layout.tokenizer_dir is not None


def prepare_checkpoint(name: PackagedModel, output: Path, *, force: bool = False) -> Path:
    """Write packaged model `name` ("smollm2" or "tiny") as a Megatron checkpoint at `output`.

    Returns at once when `output` already holds it (unless `force`). Refuses to replace a
    directory that is neither empty nor a checkpoint. Raises DeploymentError on failure; nothing
    half-written is left at `output`.
    """
    _check_name(name)
    output = Path(output).expanduser().absolute()
    if not force and is_prepared(output, name):
        return output
    output.parent.mkdir(parents=True, exist_ok=True)
    with locked(output.parent / f".{output.name}.lock"):
        if not force and is_prepared(output, name):  # another process prepared it while we waited
            return output
        _check_replaceable(output, name, force=force)
        tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
        tmp.chmod(0o777 & ~current_umask())  # mkdtemp makes it private; a checkpoint is read by other users' jobs
        try:
            _run_builder(name, tmp)
            (tmp / MANIFEST_FILE).write_text(json.dumps(_manifest(name), indent=2) + "\n")
            swap_into_place(tmp, output)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return output


def ensure_prepared(name: PackagedModel, path: Path) -> Path:
    """Make sure `path` holds packaged model `name`, preparing it on first use (cheap when cached)."""
    return prepare_checkpoint(name, path, force=False)


def current_umask() -> int:
    """This process's umask (reading it means setting it: set back at once)."""
    current = os.umask(0)
    os.umask(current)
    return current


@contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` (created if missing) while the block runs: one writer at a time."""
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _check_replaceable(output: Path, name: str, *, force: bool) -> None:
    if not output.exists():
        return
    if not output.is_dir():
        raise DeploymentError(f"{output} exists and is a file.", hint="Choose another --output.")
    if not any(output.iterdir()):
        return
    ours = (output / MANIFEST_FILE).is_file() or (output / TRACKER_FILE).is_file()
    if not ours:
        raise DeploymentError(
            f"{output} already exists and is not a checkpoint; not replacing it.",
            hint="Choose another --output (or an empty directory).",
        )
    if not force:
        raise DeploymentError(
            f"{output} holds another or an outdated checkpoint, not the current {name}.",
            hint="Pass --force to replace it, or choose another --output.",
        )


def swap_into_place(new: Path, output: Path) -> None:
    """Rename directory `new` to `output`, replacing what was there (moved aside first, then removed)."""
    old = None
    if output.exists():
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        os.rename(output, old)
    os.rename(new, output)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _run_builder(name: str, out_dir: Path) -> None:
    """Run the builder in a child process, its messages passed on as notices; raise with their tail on failure."""
    from ckpteval.notices import notice

    command = [sys.executable, "-m", "ckpteval.server", "build-packaged", name, str(out_dir)]
    tail: deque[str] = deque(maxlen=8)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "ignore")}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            notice.info(line.rstrip("\n"))
        code = proc.wait()
    if code != 0:
        last = next((line for line in reversed(tail) if line.strip()), "no output")
        raise DeploymentError(
            f"Preparing {name} failed (exit code {code}): {last}",
            hint="The messages above are the converter's output.",
        )
