"""A task client sends its first request only when its group's turn has come.

The job may run tasks whose requests carry different settings in groups, one group after another
(`ckpteval.job.request_groups`): first it probes the endpoint, then it opens the first group's turn, and
each next one when the group before has finished. Every client starts at once all the same, and prepares
(imports, data, request building) while the model loads and while earlier groups run; the job tells each
the file that opens its turn (`CKPTEVAL_REQUEST_TURN`), and its first request waits here until that file
exists. No variable: no wait.

No time limit: the job opens every turn or stops the client. Standard library only (runs inside the harness).
"""

from __future__ import annotations

import os
import sys
import threading
import time

TURN_ENV = "CKPTEVAL_REQUEST_TURN"
_POLL_S = 0.5

_open = threading.Event()


def _log(message: str) -> None:
    print(f"[ckpteval] {message}", file=sys.stderr, flush=True)


def turn_is_open() -> bool:
    """True when this client may send (no turn named, or its file exists)."""
    if _open.is_set():
        return True
    path = os.environ.get(TURN_ENV, "").strip()
    if not path or os.path.exists(path):
        _open.set()
        return True
    return False


def wait_for_turn(*, announce: bool = True) -> float:
    """Block until this client's turn is open; the seconds waited."""
    if turn_is_open():
        return 0.0
    start = time.monotonic()
    if announce:
        _log("waiting for this task's turn: the job runs tasks whose request settings differ one group at a time")
    while not turn_is_open():
        time.sleep(_POLL_S)
    waited = time.monotonic() - start
    if announce:
        _log(f"this task's turn has come: first request after waiting {waited:.1f} s")
    return waited
