"""Export destinations, in one registry: where an invocation's results go, and where `watch` draws its curves.

An entry carries its name (what `evaluate export --to` names), its config section (the dataclass that types
`export.<name>`: a default for every key, and `enabled` to turn it on), `write` (one invocation's results to
an `ExportOutcome`), `curves` (a watch run's new points, to one line that says where they went) and
`stage_secret` (the credential a job that exports itself needs, written where the job runs in a file only
its owner can read: its path, which the job's export step is given; W&B's key).
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
from typing import TYPE_CHECKING, Any

from ckpteval.config.schema import EXPORT_SECTIONS, ExportSection, MlflowExport, WandbExport, register_export_section
from ckpteval.errors import ExportError
from ckpteval.export.content import ExportContent
from ckpteval.export.context import Curves, ExportContext
from ckpteval.export.outcome import ExportOutcome
from ckpteval.registry import Registry

if TYPE_CHECKING:
    from ckpteval.cluster.remote import Remote
    from ckpteval.config.compile import CompiledConfig
    from ckpteval.config.secrets import SecretValues

# (where the job runs, its job dir, the secrets every rendering redacts, a one-line note) -> the file's path
SecretStep = Callable[["Remote", str, "SecretValues", Callable[[str], None]], "str | None"]


@dataclass(frozen=True)
class ExportDestination:
    """One place results go (see the module docstring); `label` names it in messages ("W&B")."""

    name: str
    label: str
    section: type
    write: Callable[[ExportContent, Any, ExportContext], ExportOutcome]
    curves: Callable[[Curves, Any], str] | None = None
    stage_secret: SecretStep | None = None

    def settings(self, export: ExportSection) -> Any:
        """The config's `export.<name>` (the section's defaults where the config was typed before this
        destination was registered)."""
        return export.get(self.name) or self.section()

    def enabled(self, export: ExportSection) -> bool:
        """Whether the config turns this destination on (`export.<name>.enabled`)."""
        return bool(self.settings(export).enabled)


def _register_section(destination: ExportDestination) -> None:
    register_export_section(destination.name)(destination.section)


def _forget_section(destination: ExportDestination) -> None:
    EXPORT_SECTIONS.pop(destination.name, None)


DESTINATIONS: Registry[ExportDestination] = Registry(
    "export destination",
    entry_type=ExportDestination,
    key=lambda d: d.name,
    group="destinations",
    on_register=_register_section,
    on_unregister=_forget_section,
    error=ExportError,
)


def register_destination(destination: ExportDestination) -> ExportDestination:
    """Add (or replace) the destination of `destination.name`, and its section as the config's `export.<name>`."""
    return DESTINATIONS.register(destination)


def unregister_destination(name: str) -> None:
    """Remove the destination `name` (a test's double, when the test ends), and its section."""
    DESTINATIONS.unregister(name)


def destination(name: str) -> ExportDestination:
    """The registered destination `name`; ExportError for one that is not."""
    found = DESTINATIONS.get(name)
    if found is None:
        raise ExportError(
            f"Unknown export destination {name!r}.", hint=f"Destinations: {', '.join(DESTINATIONS.names())}."
        )
    return found


def destinations() -> tuple[ExportDestination, ...]:
    """Every registered destination, in registration order (installed plugins' included)."""
    return DESTINATIONS.entries()


def stage_export_secrets(
    remote: Remote, compiled: CompiledConfig, job_dir: str, *, on_note: Callable[[str], None]
) -> str | None:
    """Give a job that exports itself the credential of each destination its config enables that needs one
    (the destination's `stage_secret`: W&B's key), in an owner-only file where it runs; the key file the
    export step reads (None: no destination needs one, or there is none to give)."""
    key_file = None
    for chosen in destinations():
        if chosen.stage_secret is not None and chosen.enabled(compiled.config.export):
            key_file = chosen.stage_secret(remote, job_dir, compiled.secrets, on_note) or key_file
    return key_file


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


def _wandb_key(remote: Remote, job_dir: str, secrets: SecretValues, on_note: Callable[[str], None]) -> str | None:
    from ckpteval.export.credentials import stage_wandb_key

    return stage_wandb_key(remote, job_dir, secrets=secrets, on_note=on_note)


register_destination(ExportDestination("wandb", "W&B", WandbExport, _wandb_write, _wandb_curves, _wandb_key))
register_destination(ExportDestination("mlflow", "MLflow", MlflowExport, _mlflow_write, _mlflow_curves))
