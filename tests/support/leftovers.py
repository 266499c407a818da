"""No test leaves a process behind: every process started under a marked test module (a watcher, the
evaluation job it started, its server and clients) inherits the mark in its environment, and after the
module no process may still carry it."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.support.waiting import wait_until

MARK = "CKPTEVAL_TEST_PROCESS_MARK"


def marked_processes(mark: str) -> list[str]:
    """`pid: command line` of every process (of this user) whose environment carries `MARK=mark`."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            stat = (proc / "stat").read_text()
            if stat[stat.rindex(")") + 2] in "ZX":
                continue  # exited, not yet reaped: it runs no more
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # gone meanwhile, or not ours
        found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def no_process_left(grace_s: float = 20.0) -> Iterator[str]:
    """Mark what the tests start; afterwards, wait up to `grace_s` for it to end, then fail naming what
    still runs (and end it, so one leak does not cascade)."""
    import signal

    mark = uuid.uuid4().hex
    before = os.environ.get(MARK)
    os.environ[MARK] = mark
    try:
        yield mark
    finally:
        if before is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = before
    with contextlib.suppress(AssertionError):  # those still there after the grace are killed, then reported
        wait_until(
            lambda: not marked_processes(mark), timeout=grace_s, what="the marked processes to end", interval=0.2
        )
    left = marked_processes(mark)
    for line in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
    assert not left, "processes left running by these tests:\n" + "\n".join(left)
