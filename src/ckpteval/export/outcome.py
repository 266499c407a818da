"""What one export destination did, in one line a user can act on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Destination = str  # a registered export destination's name (`export.destinations`): "wandb", "mlflow", ...


@dataclass(frozen=True)
class ExportOutcome:
    """The result of exporting to one destination."""

    destination: Destination
    status: Literal["exported", "skipped", "failed"]
    message: str  # one line: where the results went, or why not and what to do
    locations: tuple[str, ...] = ()  # run URLs, offline run directories, MLflow run ids
    sync_command: str | None = None  # W&B offline: the command that uploads the run later
    hint: str | None = None

    @property
    def ok(self) -> bool:
        """True unless the export failed (a skip is not a failure)."""
        return self.status != "failed"
