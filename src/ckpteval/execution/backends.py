"""The job backend of an executor: the registered executor's backend class (`ckpteval.config.executors`),
imported here on first use, so that `evaluate --help` and `--dry-run` load only the backend they use."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ckpteval.config.executors import find_executor

if TYPE_CHECKING:
    from ckpteval.execution.backend import JobBackend


def backend_for(executor: str) -> JobBackend:
    """The job backend of `executor` (a profile's, or a record's)."""
    module, _, name = find_executor(executor).backend.partition(":")
    backend: JobBackend = getattr(importlib.import_module(module), name)()
    return backend
