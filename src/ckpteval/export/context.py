"""What a destination gets besides an invocation's content: `ExportContext` (the W&B key found, the environment,
the job directory), and for a watch run the new points of its curves (`Curves`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.export.credentials import WandbKey


@dataclass(frozen=True)
class ExportContext:
    """Where an invocation's export runs: its environment (never modified) and job directory, and the W&B key
    handed in (a job's key file), if any."""

    environ: Mapping[str, str]
    job_dir: Path
    key: WandbKey | None = None


@dataclass(frozen=True)
class Curves:
    """A watch run's new points, for a destination that draws scores over training iterations."""

    run: str  # the watch run's name
    run_id: str  # the tracking run the points go to: the training's own, or one for this watch run
    own_run: bool  # False: `run_id` is the training's run, and the points go under eval/ against `iteration`
    config: dict[str, Any]  # the watch's settings, for a run of its own
    points: list[tuple[int, dict[str, float]]]  # (iteration, metric -> value), in iteration order
    directory: Path  # where a destination may keep local files (W&B's run directory)
