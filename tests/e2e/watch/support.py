"""What the watch e2e tests share: waiting with a deadline, and reading the watch run's state."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tests.support.waiting import wait_until

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T], timeout: float = 600.0, context: str = "") -> T:
    """`check()`'s first true value, polled every 0.3 s; an AssertionError naming `what` (and `context`)
    when none came within `timeout` seconds (`wait_until`)."""
    return wait_until(check, timeout=timeout, what=what, interval=0.3, context=(lambda: context) if context else None)


def watch_state(state_dir: Path) -> dict | None:
    """The state.json of the one watch run under `state_dir`, or None before it exists."""
    files = list((state_dir / "watch").glob("*/state.json"))
    return json.loads(files[0].read_text()) if files else None
