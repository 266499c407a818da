"""Export one finished invocation to every destination its config enables (or the ones asked for).

`export_invocation` is what runs after an evaluation (here, or inside a cluster job) and what
`evaluate export` runs again later (`ckpteval.api.export`). A destination that fails or is skipped never
fails the evaluation: each one ends in an `ExportOutcome`, reported (the CLI prints it as one line that
says where the results went, or why not and how to retry) and returned.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpteval.config.schema import ExportSection
from ckpteval.errors import ExportError
from ckpteval.export.content import RESULTS_FILE, ExportContent, load_content
from ckpteval.export.context import ExportContext
from ckpteval.export.credentials import WandbKey
from ckpteval.export.destinations import ExportDestination, destination, destinations
from ckpteval.export.outcome import Destination, ExportOutcome
from ckpteval.results.model import InvocationResults

Reporter = Callable[[ExportOutcome], None]  # any event reporter takes these too


def enabled_destinations(export: ExportSection) -> list[Destination]:
    """The destinations the config turns on (`export.<name>.enabled`), in registration order."""
    return [d.name for d in destinations() if d.enabled(export)]


def export_section(config: Mapping[str, Any], *, where: str = "config.yaml") -> ExportSection:
    """The typed `export` section of a saved config (each destination registered here, from its section).

    A destination the config names that is not registered here was registered by the code that compiled it
    (a Slurm job's export step runs without that code): it is left out, and if the config enabled it,
    `export_invocation` reports it as failed, with where to export it from."""
    from ckpteval.config.schema import EXPORT_SECTIONS, Export
    from ckpteval.config.typed import typed_value

    destinations()  # the installed packages' destinations (entry points) register their sections
    raw = config.get("export") or {}
    here = {name: value for name, value in raw.items() if name in EXPORT_SECTIONS}
    section: ExportSection = typed_value(Export, here, where=where, path="export")
    elsewhere = [n for n, v in raw.items() if n not in here and isinstance(v, Mapping) and v.get("enabled") is True]
    return ExportSection(section, unregistered=tuple(elsewhere)) if elsewhere else section


def export_invocation(
    results: InvocationResults,
    job_dir: Path,
    export: ExportSection,
    *,
    destinations: Sequence[Destination] | None = None,
    config_file: Path | None = None,
    task_dirs: Mapping[str, str] | None = None,
    key: WandbKey | None = None,
    environ: Mapping[str, str] | None = None,
    report: Reporter | None = None,
) -> list[ExportOutcome]:
    """Export `results` (with the files of `job_dir`) to `destinations` (default: those `export` enables).

    Each destination comes from the registry (`export.destinations`). The W&B key is `key` if given, else
    found from the environment or the user's `wandb login`.
    `environ` (default `os.environ`, never modified) supplies WANDB_MODE / WANDB_BASE_URL /
    MLFLOW_TRACKING_URI. Returns one outcome per destination; never raises for a destination's failure.
    """
    chosen = list(destinations) if destinations is not None else enabled_destinations(export)
    outcomes = [] if destinations is not None else [_unregistered(name, results) for name in export.unregistered]
    for outcome in outcomes:
        if report is not None:
            report(outcome)
    if not chosen:
        return outcomes
    env = os.environ if environ is None else environ
    with tempfile.TemporaryDirectory(prefix="ckpteval-export-") as scratch:
        content = _content(results, job_dir, config_file=config_file, task_dirs=task_dirs, scratch=Path(scratch))
        context = ExportContext(environ=env, job_dir=job_dir, key=key)
        for name in chosen:
            outcome = _export_one(destination(name), content, export, context)
            if report is not None:
                report(outcome)
            outcomes.append(outcome)
    return outcomes


def _unregistered(name: str, results: InvocationResults) -> ExportOutcome:
    return ExportOutcome(
        name,
        "failed",
        f"export.{name} is enabled, but no destination {name!r} is registered where this export ran.",
        hint=f"Export it from the code that registers it: ckpteval.export({results.invocation!r}, [{name!r}]).",
    )


def _export_one(
    where: ExportDestination, content: ExportContent, export: ExportSection, context: ExportContext
) -> ExportOutcome:
    """One destination's outcome: what it wrote or skipped, or why it failed and how to retry."""
    retry = f"evaluate export {content.invocation} --to {where.name}"
    try:
        return where.write(content, where.settings(export), context)
    except ExportError as exc:
        return ExportOutcome(where.name, "failed", exc.message, hint=exc.hint or f"Retry with: {retry}")
    except OSError as exc:  # a result file vanished or a run directory is not writable
        return ExportOutcome(where.name, "failed", f"{where.label} export: {exc}", hint=f"Retry with: {retry}")


def _content(
    results: InvocationResults,
    job_dir: Path,
    *,
    config_file: Path | None,
    task_dirs: Mapping[str, str] | None,
    scratch: Path,
) -> ExportContent:
    content = load_content(job_dir, results, config_file=config_file, task_dirs=dict(task_dirs or {}))
    if RESULTS_FILE in content.files:
        return content
    # results collected but not saved beside the job (a cluster job's results fetched here): export them
    snapshot = scratch / RESULTS_FILE
    import json

    snapshot.write_text(json.dumps(results.to_json(), indent=2) + "\n", encoding="utf-8")
    return dataclasses.replace(content, files={**content.files, RESULTS_FILE: snapshot})
