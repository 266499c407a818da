"""What the library reports while it works, for a front end to render (the CLI draws them with rich; the
delegate service and Python callers pass `silent`).

A reporter is any callable taking one event. Code deep in a step that has no reporter at hand writes a
notice instead (`ckpteval.notices`). Besides the events below it receives the events of the
steps it drives: `ckpteval.cluster.squash.SquashEvent` (image imports) and `ckpteval.export.outcome.ExportOutcome`
(one per export destination). The library never prints and never asks: a question (cancel a followed
Slurm job after Ctrl-C?) is the front end's, from the `Outcome` it gets back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ckpteval.config.compile import CompiledConfig
    from ckpteval.config.preview import PreviewPanel
    from ckpteval.execution.snapshot import JobSnapshot
    from ckpteval.invocation.record import InvocationRecord
    from ckpteval.results.model import InvocationResults

Reporter = Callable[[Any], None]


def silent(_event: Any) -> None:
    """A reporter that ignores every event."""


@dataclass(frozen=True)
class Preview:
    """The preview of an invocation (all that --dry-run shows): summary, compiled config, extra panels."""

    compiled: CompiledConfig
    invocation: str
    panels: Sequence[PreviewPanel]
    dry_run: bool


@dataclass(frozen=True)
class Note:
    """One line for the user: `info` (dim), `notice` (plain), `warning` (yellow), `change` (cyan, Slurm's view)."""

    text: str
    level: Literal["info", "notice", "warning", "change"] = "info"


@dataclass(frozen=True)
class Submitted:
    """A detached job was submitted (or resubmitted): the commands that follow it up go with it."""

    record: InvocationRecord
    resumed: bool = False


@dataclass(frozen=True)
class Progress:
    """The job's state now (one per tick while following)."""

    snapshot: JobSnapshot


@dataclass(frozen=True)
class LogLines:
    """New lines of the job's log while following."""

    lines: tuple[str, ...]


@dataclass(frozen=True)
class FollowEnded:
    """Following stopped (the job ended, or Ctrl-C)."""


@dataclass(frozen=True)
class ResultsReady:
    """The job's results, collected (before they are exported)."""

    results: InvocationResults
