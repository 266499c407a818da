"""Notices: one-line messages for the user from code deep in a step that has no event reporter at hand
(the W&B login found while compiling a config, a model converter's progress).

They go to the `ckpteval.notice` logger. A front end shows them (`show_notices`: the CLI, and the
`python -m ckpteval.server` entry point, on stderr); a Python caller sees them only if it configures logging.
"""

from __future__ import annotations

import logging
import sys

notice = logging.getLogger("ckpteval.notice")


class _ToStderr(logging.Handler):
    """Each notice as one plain line on the stderr of the moment (a test may have swapped it)."""

    def emit(self, record: logging.LogRecord) -> None:
        sys.stderr.write(self.format(record) + "\n")
        sys.stderr.flush()


def show_notices() -> None:
    """For a front end: write the library's notices to stderr, one plain line each."""
    if not any(isinstance(h, _ToStderr) for h in notice.handlers):
        notice.addHandler(_ToStderr())
    notice.setLevel(logging.INFO)
    notice.propagate = False
