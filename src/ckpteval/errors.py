"""The errors a user can act on.

Library code raises these; only the CLI turns them into one line on stderr and an exit code.
Every message says what went wrong and, in `hint`, what to do about it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class CkptevalError(Exception):
    """Base class: an error with a message for the user and an optional fix."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n{self.hint}"


class ConfigError(CkptevalError):
    """The configuration, a profile or the command line is wrong."""

    exit_code = 2


class ClusterError(CkptevalError):
    """SSH, Slurm, squash or job-submission trouble."""


class DeploymentError(CkptevalError):
    """The model server could not be prepared, started or reached."""


class EvaluationError(CkptevalError):
    """A task could not run or its results could not be read."""


class ExportError(CkptevalError):
    """Results could not be exported (W&B, MLflow)."""


def close_matches(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The candidates that look like `word`, best first (for "did you mean" hints)."""
    return difflib.get_close_matches(word, list(candidates), n=n, cutoff=0.6)


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """A " Did you mean X?" suffix, or "" when nothing is close."""
    matches = close_matches(word, candidates)
    if not matches:
        return ""
    return " Did you mean " + " or ".join(f"'{m}'" for m in matches) + "?"
