"""Export destinations, in one registry: where an invocation's results go, and where `watch` draws its curves.

An entry carries its name (what `evaluate export --to` names), its config section (the dataclass that types
`export.<name>`: a default for every key, and `enabled` to turn it on), `write` (one invocation's results to
an `ExportOutcome`) and `curves` (a watch run's new points, to one line that says where they went).
Registering a destination registers its section with the config (`config.schema.register_export_section`):
from then on a config may set `export.<name>.*`.
`export.invocation.export_invocation` and `watch.curves.export_curves` go through the registry; neither names
a destination.

W&B and MLflow are registered at the end of this module; their code is `export.to_wandb` and
`export.to_mlflow`, imported when one runs (wandb and mlflow load only then); their sections are in
`config.schema` (a config is typed before any destination is asked).
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckpteval.config.schema import EXPORT_SECTIONS, ExportSection, MlflowExport, WandbExport, register_export_section
from ckpteval.errors import ExportError
from ckpteval.export.content import ExportContent
from ckpteval.export.context import Curves, ExportContext
from ckpteval.export.outcome import ExportOutcome


@dataclass(frozen=True)
class ExportDestination:
    """One place results go (see the module docstring); `label` names it in messages ("W&B")."""

    name: str
    label: str
    section: type
    write: Callable[[ExportContent, Any, ExportContext], ExportOutcome]
    curves: Callable[[Curves, Any], str] | None = None

    def settings(self, export: ExportSection) -> Any:
        """The config's `export.<name>` (the section's defaults where the config was typed before this
        destination was registered)."""
        return export.get(self.name) or self.section()

    def enabled(self, export: ExportSection) -> bool:
        """Whether the config turns this destination on (`export.<name>.enabled`)."""
        return bool(self.settings(export).enabled)


_REGISTRY: dict[str, ExportDestination] = {}


def register_destination(destination: ExportDestination) -> ExportDestination:
    """Add (or replace) the destination of `destination.name`, and its section as the config's `export.<name>`."""
    register_export_section(destination.name)(destination.section)
    _REGISTRY[destination.name] = destination
    return destination


def unregister_destination(name: str) -> None:
    """Remove the destination `name` (a test's double, when the test ends), and its section."""
    _REGISTRY.pop(name, None)
    EXPORT_SECTIONS.pop(name, None)


def destination(name: str) -> ExportDestination:
    """The registered destination `name`; ExportError for one that is not."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ExportError(
            f"Unknown export destination {name!r}.", hint=f"Destinations: {', '.join(_REGISTRY)}."
        ) from None


def destinations() -> tuple[ExportDestination, ...]:
    """Every registered destination, in registration order."""
    return tuple(_REGISTRY.values())


def _wandb_write(content: ExportContent, settings: Any, context: ExportContext) -> ExportOutcome:
    from ckpteval.export.to_wandb import write_invocation

    return write_invocation(content, settings, context)


def _wandb_curves(curves: Curves, settings: Any) -> str:
    from ckpteval.export.to_wandb import write_curves

    return write_curves(curves, settings)


def _mlflow_write(content: ExportContent, settings: Any, context: ExportContext) -> ExportOutcome:
    from ckpteval.export.to_mlflow import export_to_mlflow

    return export_to_mlflow(content, settings)


def _mlflow_curves(curves: Curves, settings: Any) -> str:
    from ckpteval.export.to_mlflow import write_curves

    return write_curves(curves, settings)


register_destination(ExportDestination("wandb", "W&B", WandbExport, _wandb_write, _wandb_curves))
register_destination(ExportDestination("mlflow", "MLflow", MlflowExport, _mlflow_write, _mlflow_curves))
