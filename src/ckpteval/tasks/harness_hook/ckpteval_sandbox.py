"""Run one untrusted Python program (a model's HumanEval completion plus its tests) in a sandbox.

Self-contained (standard library only): this file lives in the hook directory that is put on the
harness's PYTHONPATH, and it is also executed as the sandbox's child process (`python -I this_file`).

The program never runs in the evaluator's process. Each program gets a fresh child process with:
- a wall-clock limit (the HF `code_eval` semantics: `timeout` seconds for the program itself; the
  parent kills the whole process tree a little later if the child does not stop by itself), plus a
  CPU-time limit as a backstop;
- an address-space limit (`RLIMIT_AS`), so a huge allocation fails with MemoryError;
- no network: a new network namespace (`unshare --user --map-root-user --net --pid --fork`, which
  works for root and, with user namespaces enabled, for unprivileged users; the PID namespace also
  lets the parent kill every process the program forks). Where namespaces are unavailable, the child
  replaces the socket constructors with one that raises; that is weaker (ctypes can bypass it) and
  `isolation()` reports it;
- Landlock (Linux >= 5.13, no privileges needed): the file system is read-only except the program's
  own temporary directory; with Landlock ABI >= 4 TCP connect/bind are denied as well, and with
  ABI >= 6 the program cannot signal processes outside the sandbox;
- an environment with nothing from the evaluator's (no API keys), HOME and TMPDIR in its temp dir.

A program passes only if it ran to the end without raising: the child reports the outcome on a
dedicated pipe together with a nonce it received on stdin, so an early `os._exit(0)` or a program
that prints "passed" does not count as a pass. (This guards against accidents, not against a program
written to defeat the check.)
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

DEFAULT_TIMEOUT_S = 3.0  # HF code_eval's default
DEFAULT_MEMORY_MB = 1024
_KILL_GRACE_S = 5.0  # child start-up (interpreter, namespaces) on top of the program's own limit
_RESULT_FD_ENV = "CKPTEVAL_SANDBOX_RESULT_FD"


@dataclass(frozen=True)
class Outcome:
    """What happened to one program: `passed`, and HF code_eval's result string."""

    passed: bool
    result: str  # "passed", "timed out", "failed: <exception>"


@dataclass(frozen=True)
class Isolation:
    """Which isolation layers this machine gives a sandboxed program."""

    network_namespace: bool
    landlock_abi: int  # 0: unavailable

    def describe(self) -> str:
        """One line for logs and provenance."""
        net = "network namespace" if self.network_namespace else "socket constructors disabled (no namespaces)"
        if self.landlock_abi >= 1:
            fs = f"Landlock ABI {self.landlock_abi}: read-only file system except its temp dir"
        else:
            fs = "no Landlock: file system writable where the user can write (cwd is a temp dir)"
        return f"subprocess, wall/CPU/memory limits, {net}, {fs}"


_ISOLATION: Isolation | None = None
_ISOLATION_LOCK = threading.Lock()


def _unshare_argv() -> list[str]:
    return ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"]


def _probe_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run([*_unshare_argv(), "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def isolation() -> Isolation:
    """Probe (once per process) what isolation is available here."""
    global _ISOLATION
    with _ISOLATION_LOCK:
        if _ISOLATION is None:
            _ISOLATION = Isolation(network_namespace=_probe_unshare(), landlock_abi=_landlock_abi())
        return _ISOLATION


def run_program(program: str, *, timeout: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB) -> Outcome:
    """Run `program` in a fresh sandboxed child process and report whether it completed without error."""
    iso = isolation()
    nonce = secrets.token_hex(16)
    workdir = tempfile.mkdtemp(prefix="ckpteval-sandbox-")
    read_fd, write_fd = os.pipe()
    argv = [sys.executable, "-I", "-B", os.path.abspath(__file__)]
    if iso.network_namespace:
        argv = [*_unshare_argv(), *argv]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        _RESULT_FD_ENV: str(write_fd),
    }
    request = {
        "program": program,
        "nonce": nonce,
        "timeout": timeout,
        "memory_bytes": int(memory_mb) * 1024 * 1024,
        "workdir": workdir,
        "block_sockets": not iso.network_namespace,
        "landlock": iso.landlock_abi >= 1,
    }
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
            env=env,
            pass_fds=(write_fd,),
            start_new_session=True,  # its own process group: we can kill everything it started
        )
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        shutil.rmtree(workdir, ignore_errors=True)
        return Outcome(False, f"failed: could not start the sandbox: {exc}")
    os.close(write_fd)
    report = _Reader(read_fd)
    report.start()
    try:
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(request).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            proc.wait(timeout=timeout + _KILL_GRACE_S)
            killed = False
        except subprocess.TimeoutExpired:
            killed = True
    finally:
        _kill_group(proc)
        report.join(timeout=5)
        shutil.rmtree(workdir, ignore_errors=True)
    if killed:
        return Outcome(False, "timed out")
    return _judge(report.data, nonce)


class _Reader(threading.Thread):
    """Drain the result pipe (bounded) so a chatty child can never block on it."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.data = b""

    def run(self) -> None:
        chunks: list[bytes] = []
        size = 0
        with os.fdopen(self.fd, "rb") as fh:
            while chunk := fh.read(65536):
                if size < 65536:
                    chunks.append(chunk)
                size += len(chunk)
        self.data = b"".join(chunks)[:65536]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _judge(data: bytes, nonce: str) -> Outcome:
    for line in reversed(data.decode("utf-8", "replace").splitlines()):
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and msg.get("nonce") == nonce:
            result = str(msg.get("result", "failed: no result"))
            return Outcome(result == "passed", result)
    return Outcome(False, "failed: the program ended without reporting a result")


# ---- landlock (ctypes; x86-64 and arm64 share these syscall numbers) ----

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _landlock_abi() -> int:
    if not sys.platform.startswith("linux"):
        return 0
    try:
        abi = _libc().syscall(_SYS_CREATE_RULESET, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    except (OSError, AttributeError):
        return 0
    return max(int(abi), 0)


def _apply_landlock(workdir: str) -> int:
    """Restrict this process: read-only file system except `workdir`, no TCP, no outside signals."""
    import ctypes

    abi = _landlock_abi()
    if abi < 1:
        return 0
    libc = _libc()
    fs_all = (1 << 13) - 1  # ABI 1: EXECUTE .. MAKE_SYM
    if abi >= 2:
        fs_all |= 1 << 13  # REFER
    if abi >= 3:
        fs_all |= 1 << 14  # TRUNCATE
    if abi >= 5:
        fs_all |= 1 << 15  # IOCTL_DEV

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    net = 0b11 if abi >= 4 else 0  # BIND_TCP | CONNECT_TCP, with no rule allowing any port
    scoped = 0b11 if abi >= 6 else 0  # ABSTRACT_UNIX_SOCKET | SIGNAL
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    attr = RulesetAttr(fs_all, net, scoped)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        return 0
    try:
        for path, access in (("/", _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR), (workdir, fs_all)):
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = PathBeneath(access, pfd)
                if libc.syscall(_SYS_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0) < 0:
                    return 0
            finally:
                os.close(pfd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0:
            return 0
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) < 0:
            return 0
    finally:
        os.close(ruleset)
    return abi


# ---- the child ----


class _TimedOut(BaseException):
    pass


def _block_sockets() -> None:
    """Fallback when no network namespace is available: make socket creation fail."""
    import _socket
    import socket

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise PermissionError("network access is disabled in the ckpteval sandbox")

    for mod in (socket, _socket):
        for name in ("socket", "socketpair", "create_connection", "fromfd"):
            if hasattr(mod, name):
                setattr(mod, name, refuse)


def _child() -> None:
    import resource

    result_fd = int(os.environ.pop(_RESULT_FD_ENV))
    request = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    nonce = request.pop("nonce")
    program = request.pop("program")
    timeout = float(request["timeout"])
    workdir = request["workdir"]

    def report(result: str) -> None:
        os.write(result_fd, (json.dumps({"nonce": nonce, "result": result}) + "\n").encode())
        os._exit(0)

    cpu = int(timeout) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    memory = int(request["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.chdir(workdir)
    if request["landlock"]:
        _apply_landlock(workdir)
    if request["block_sockets"]:
        _block_sockets()

    def on_alarm(_signum: int, _frame: object) -> None:
        raise _TimedOut()

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        exec(compile(program, "<completion>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except _TimedOut:
        signal.setitimer(signal.ITIMER_REAL, 0)
        report("timed out")
    except BaseException as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        report(f"failed: {type(exc).__name__}: {exc}"[:500])
    signal.setitimer(signal.ITIMER_REAL, 0)
    report("passed")


if __name__ == "__main__":
    _child()
