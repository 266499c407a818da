"""`wait_until`: the one way a test waits for something to happen.

A test that waits asserts an outcome, not a speed: the timeout is the bound past which the thing is taken
never to happen (a hang), so it is generous, and a loaded machine only makes the wait longer, never a
failure. Polling stops as soon as the condition holds.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    unless: Callable[[], object] | None = None,
    context: Callable[[], str] | None = None,
) -> T:
    """`condition()`'s first true value, polled every `interval` seconds.

    Fails (AssertionError naming `what`, and `context()` when given) after `timeout` seconds, or at once
    when `unless()` is true: something that means the condition can no longer come (a process exited).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if unless is not None and unless():
            # one last look: the condition may have come just before what ended it
            value = condition()
            if value:
                return value
            raise AssertionError(f"gave up waiting for {what}" + (f":\n{context()}" if context else ""))
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}" + (f":\n{context()}" if context else "")
            )
        time.sleep(interval)


def answers(url: str, timeout: float = 5.0) -> str | None:
    """The body `url` answers with now (any 2xx), or None while nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode(errors="replace"))
    except (OSError, ValueError):
        return None
