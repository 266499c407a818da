"""File checks on paths a user typed: a name the OS refuses (too long, a NUL byte) is "not there", not an OSError."""

from __future__ import annotations

from pathlib import Path


def is_file(path: Path) -> bool:
    """`path.is_file()`, False for a name the OS refuses instead of raising."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def is_dir(path: Path) -> bool:
    """`path.is_dir()`, False for a name the OS refuses instead of raising."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False
