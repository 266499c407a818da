"""What the watch e2e tests share: waiting with a deadline, and reading the watch run's state."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T], timeout: float = 600.0, context: str = "") -> T:
    """`check()`'s first true value, polled every 0.3 s; an AssertionError naming `what` (and `context`)
    when none came within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}" + (f" ({context})" if context else ""))


def watch_state(state_dir: Path) -> dict | None:
    """The state.json of the one watch run under `state_dir`, or None before it exists."""
    files = list((state_dir / "watch").glob("*/state.json"))
    return json.loads(files[0].read_text()) if files else None
