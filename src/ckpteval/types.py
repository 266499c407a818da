"""The values the library returns and the events it reports, in one place for its front ends (the CLI,
the delegate service, a user's script): `from ckpteval.types import Preview, InvocationResults`.

Part of the public API (docs/architecture.md). Each name loads its module on first use, so importing
this module costs nothing.
"""

# The imports under TYPE_CHECKING are read by type checkers; `__all__` is made from `_WHERE`, so ruff does
# not see them used.
# ruff: noqa: F401
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# For type checkers only; at run time each name loads from `_WHERE` (tests/unit/test_public_api.py keeps
# the two the same).
if TYPE_CHECKING:
    from ckpteval.api import Outcome
    from ckpteval.checkpoint.description import CheckpointDescription
    from ckpteval.cluster.data_push import PushResult
    from ckpteval.cluster.squash import SquashEvent, SquashPlan, SquashResult
    from ckpteval.config.compile import CompiledConfig
    from ckpteval.config.compose import CompileRequest
    from ckpteval.config.preview import PreviewPanel
    from ckpteval.delegate.service import DelegateSettings
    from ckpteval.execution.backend import InvocationStatus
    from ckpteval.execution.events import (
        FollowEnded,
        LogLines,
        Note,
        Preview,
        Progress,
        Reporter,
        ResultsReady,
        Submitted,
    )
    from ckpteval.execution.snapshot import JobSnapshot, TaskSnapshot
    from ckpteval.export.outcome import Destination, ExportOutcome
    from ckpteval.invocation.record import InvocationRecord
    from ckpteval.library import InvocationAnswers, TaskInfo, WatchCurves, WatchRun
    from ckpteval.results.answers import DocumentAnswer, Flip, TaskFlips
    from ckpteval.results.compare import Comparison, MetricComparison
    from ckpteval.results.model import InvocationResults
    from ckpteval.server.options import ServeOptions
    from ckpteval.tasks.data_cache import FetchResult
    from ckpteval.watch.loop import WatchEvent
    from ckpteval.watch.run import DryRun as WatchDryRun
    from ckpteval.watch.run import Health as WatchHealth
    from ckpteval.watch.run import StopResult as WatchStopResult
    from ckpteval.watch.run import WatchOutcome
    from ckpteval.watch.state import WatchSpec, WatchState

# The public names, each with the module it loads from on first use ("module:attribute" where it is renamed).
_WHERE = {
    "Outcome": "ckpteval.api",
    "PushResult": "ckpteval.cluster.data_push",
    "SquashEvent": "ckpteval.cluster.squash",
    "SquashPlan": "ckpteval.cluster.squash",
    "SquashResult": "ckpteval.cluster.squash",
    "CompiledConfig": "ckpteval.config.compile",
    "CompileRequest": "ckpteval.config.compose",
    "PreviewPanel": "ckpteval.config.preview",
    "DelegateSettings": "ckpteval.delegate.service",
    "CheckpointDescription": "ckpteval.checkpoint.description",
    "ServeOptions": "ckpteval.server.options",
    "InvocationStatus": "ckpteval.execution.backend",
    "FollowEnded": "ckpteval.execution.events",
    "LogLines": "ckpteval.execution.events",
    "Note": "ckpteval.execution.events",
    "Preview": "ckpteval.execution.events",
    "Progress": "ckpteval.execution.events",
    "Reporter": "ckpteval.execution.events",
    "ResultsReady": "ckpteval.execution.events",
    "Submitted": "ckpteval.execution.events",
    "JobSnapshot": "ckpteval.execution.snapshot",
    "TaskSnapshot": "ckpteval.execution.snapshot",
    "Destination": "ckpteval.export.outcome",
    "ExportOutcome": "ckpteval.export.outcome",
    "InvocationRecord": "ckpteval.invocation.record",
    "InvocationAnswers": "ckpteval.library",
    "TaskInfo": "ckpteval.library",
    "WatchCurves": "ckpteval.library",
    "WatchRun": "ckpteval.library",
    "DocumentAnswer": "ckpteval.results.answers",
    "Flip": "ckpteval.results.answers",
    "TaskFlips": "ckpteval.results.answers",
    "Comparison": "ckpteval.results.compare",
    "MetricComparison": "ckpteval.results.compare",
    "InvocationResults": "ckpteval.results.model",
    "FetchResult": "ckpteval.tasks.data_cache",
    "WatchEvent": "ckpteval.watch.loop",
    "WatchDryRun": "ckpteval.watch.run:DryRun",
    "WatchHealth": "ckpteval.watch.run:Health",
    "WatchOutcome": "ckpteval.watch.run",
    "WatchStopResult": "ckpteval.watch.run:StopResult",
    "WatchSpec": "ckpteval.watch.state",
    "WatchState": "ckpteval.watch.state",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """A type, imported from its module on first use."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'ckpteval.types' has no attribute {name!r}")
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute or name)
