"""The one seam for every side effect on the cluster: run a command, move a file.

`Remote` is what the squash step, the Slurm helper and the results fetcher talk to. Two
implementations: `LocalRemote` (subprocess, for a CLI that runs on the login node, tunnel="local")
and `SSHRemote` (paramiko, one connection reused for a whole invocation, tunnel="ssh";
in `ckpteval.cluster.ssh`). `ckpteval.cluster.connect.connect_remote(profile)` picks one.

A command is an argv list (each word is quoted with `shlex.quote`, so nothing in it is ever
interpreted by the remote shell) or, for the rare pipeline, a string the caller has built from
quoted pieces. Every command is logged at DEBUG on the `ckpteval.remote` logger.
"""

from __future__ import annotations

import logging
import os
import selectors
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from ckpteval.errors import ClusterError

if TYPE_CHECKING:
    pass

log = logging.getLogger("ckpteval.remote")

# (stream name "stdout"|"stderr", one line without its newline)
LineCallback = Callable[[str, str], None]


@dataclass(frozen=True)
class RunResult:
    """What a finished remote command returned."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.returncode == 0


def command_line(argv: Sequence[str] | str) -> str:
    """The shell command line for `argv`: a list is quoted word by word, a string is used as is."""
    if isinstance(argv, str):
        return argv
    if not argv:
        raise ValueError("empty command")
    return shlex.join(argv)


class ConnectionLost(ClusterError):
    """The connection to the cluster dropped (or was closed): the command may be retried on a new one."""


def check_result(result: RunResult, cmd: str, where: str) -> RunResult:
    """Raise a ClusterError naming the command and its stderr when `result` failed."""
    if result.ok:
        return result
    detail = (result.stderr.strip() or result.stdout.strip())[-2000:]
    raise ClusterError(
        f"Command failed on {where} (exit {result.returncode}): {shorten(cmd)}" + (f"\n{detail}" if detail else ""),
    )


def shorten(cmd: str, limit: int = 300) -> str:
    return cmd if len(cmd) <= limit else cmd[: limit - 3] + "..."


@runtime_checkable
class Remote(Protocol):
    """A place where commands run and files live: the cluster's login node."""

    @property
    def description(self) -> str:
        """Where commands run, for messages: `user@host:port` or `this machine`."""
        ...

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        timeout: float | None = None,
        check: bool = True,
        stdin: str | bytes | None = None,
    ) -> RunResult:
        """Run a command to completion; `check` raises ClusterError on a non-zero exit."""
        ...

    def stream(
        self,
        argv: Sequence[str] | str,
        *,
        on_line: LineCallback,
        timeout: float | None = None,
        hold_stdin: bool = False,
    ) -> RunResult:
        """Run a command, calling `on_line(stream, line)` for each output line as it arrives.

        With `hold_stdin` the command's stdin stays open (and empty) until it exits, so a
        command can notice that this client went away: its stdin reaches end-of-file.
        Never raises for a non-zero exit; the caller reads `returncode`.
        """
        ...

    def put(self, local: Path, remote: str) -> None:
        """Copy a local file to a remote path (written under a temporary name, then renamed)."""
        ...

    def get(self, remote: str, local: Path) -> None:
        """Copy a remote file to a local path (written under a temporary name, then renamed)."""
        ...

    def read_text(self, path: str) -> str:
        """The content of a remote text file (ClusterError if it cannot be read)."""
        ...

    def read_text_if_exists(self, path: str) -> str | None:
        """The content of a remote text file, or None if it does not exist."""
        ...

    def read_bytes_from(self, path: str, offset: int) -> bytes | None:
        """A remote file's bytes from `offset` to its end (None if the file does not exist)."""
        ...

    def write_text_atomic(self, path: str, text: str, *, mode: int = 0o644) -> None:
        """Write a remote file under a temporary name and rename it into place."""
        ...

    def exists(self, path: str) -> bool:
        """Whether a remote path exists."""
        ...

    def close(self) -> None:
        """Release the connection; the Remote cannot be used afterwards."""
        ...

    def __enter__(self) -> Self:
        """A Remote is a context manager that closes itself."""
        ...

    def __exit__(self, *exc: object) -> None: ...


class LocalRemote:
    """Commands run here, with subprocess: for a CLI running on the cluster's login node."""

    description = "this machine"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        timeout: float | None = None,
        check: bool = True,
        stdin: str | bytes | None = None,
    ) -> RunResult:
        """Run a command to completion; `check` raises ClusterError on a non-zero exit."""
        cmd = command_line(argv)
        log.debug("[local] $ %s", cmd)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        try:
            proc = subprocess.run(
                _local_argv(argv),
                input=data,
                capture_output=True,
                timeout=timeout,
                stdin=None if data is not None else subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ClusterError(f"Command timed out after {timeout:g} s on this machine: {shorten(cmd)}") from None
        except FileNotFoundError as exc:
            return RunResult(127, "", f"{exc.filename}: command not found")
        result = RunResult(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))
        return check_result(result, cmd, self.description) if check else result

    def stream(
        self,
        argv: Sequence[str] | str,
        *,
        on_line: LineCallback,
        timeout: float | None = None,
        hold_stdin: bool = False,
    ) -> RunResult:
        """Run a command, calling `on_line(stream, line)` for each output line as it arrives."""
        cmd = command_line(argv)
        log.debug("[local] $ %s", cmd)
        try:
            proc = subprocess.Popen(
                _local_argv(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.PIPE if hold_stdin else subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            return RunResult(127, "", f"{exc.filename}: command not found")
        assert proc.stdout is not None and proc.stderr is not None
        collected = {"stdout": LineBuffer("stdout", on_line), "stderr": LineBuffer("stderr", on_line)}
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
            sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
            open_streams = 2
            while open_streams:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    proc.kill()
                    proc.wait()
                    raise ClusterError(f"Command timed out after {timeout:g} s on this machine: {shorten(cmd)}")
                for key, _ in sel.select(timeout=wait):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                    else:
                        collected[key.data].feed(chunk)
        if proc.stdin is not None:
            proc.stdin.close()
        returncode = proc.wait()
        return RunResult(returncode, collected["stdout"].finish(), collected["stderr"].finish())

    def put(self, local: Path, remote: str) -> None:
        """Copy a local file to a path on this machine (temporary name, then rename)."""
        log.debug("[local] put %s -> %s", local, remote)
        _copy_atomic(Path(local), Path(remote))

    def get(self, remote: str, local: Path) -> None:
        """Copy a file on this machine to a local path (temporary name, then rename)."""
        log.debug("[local] get %s -> %s", remote, local)
        _copy_atomic(Path(remote), Path(local))

    def read_text(self, path: str) -> str:
        """The content of a text file on this machine."""
        log.debug("[local] read %s", path)
        try:
            return Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ClusterError(f"Cannot read {path} on this machine: {exc.strerror}.") from None

    def read_text_if_exists(self, path: str) -> str | None:
        """The content of a text file on this machine, or None if it does not exist."""
        try:
            return Path(path).read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise ClusterError(f"Cannot read {path} on this machine: {exc.strerror}.") from None

    def read_bytes_from(self, path: str, offset: int) -> bytes | None:
        """A file's bytes from `offset` on (None if it does not exist)."""
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise ClusterError(f"Cannot read {path} on this machine: {exc.strerror}.") from None

    def write_text_atomic(self, path: str, text: str, *, mode: int = 0o644) -> None:
        """Write a text file on this machine under a temporary name and rename it into place."""
        log.debug("[local] write %s", path)
        target = Path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except OSError as exc:
            raise ClusterError(f"Cannot write {path} on this machine: {exc.strerror}.") from None

    def exists(self, path: str) -> bool:
        """Whether a path exists on this machine."""
        return os.path.lexists(path)

    def close(self) -> None:
        """Nothing to release."""


def _local_argv(argv: Sequence[str] | str) -> list[str]:
    # a string is a shell command line, as it would be over SSH
    return ["/bin/sh", "-c", argv] if isinstance(argv, str) else list(argv)


def _copy_atomic(src: Path, dst: Path) -> None:
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
        os.close(fd)
        try:
            shutil.copyfile(src, tmp)
            shutil.copymode(src, tmp)
            os.replace(tmp, dst)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        raise ClusterError(f"Cannot copy {src} to {dst}: {exc.strerror}.") from None


class LineBuffer:
    """Splits a byte stream into lines for a callback and keeps the whole text."""

    def __init__(self, name: str, on_line: LineCallback) -> None:
        self._name = name
        self._on_line = on_line
        self._pending = b""
        self._parts: list[bytes] = []

    def feed(self, chunk: bytes) -> None:
        self._parts.append(chunk)
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            self._on_line(self._name, line.decode(errors="replace").rstrip("\r"))

    def finish(self) -> str:
        if self._pending:
            self._on_line(self._name, self._pending.decode(errors="replace").rstrip("\r"))
            self._pending = b""
        return b"".join(self._parts).decode(errors="replace")
