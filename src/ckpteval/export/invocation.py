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
from ckpteval.export.credentials import LOGIN_HINT, WandbKey, announce_login, find_wandb_key, wandb_base_url, wandb_mode
from ckpteval.export.outcome import Destination, ExportOutcome
from ckpteval.results.model import InvocationResults

DESTINATIONS: tuple[Destination, ...] = ("wandb", "mlflow")
Reporter = Callable[[ExportOutcome], None]  # any event reporter takes these too


def enabled_destinations(export: ExportSection) -> list[Destination]:
    """The destinations the config turns on (`export.wandb.enabled`, `export.mlflow.enabled`)."""
    out: list[Destination] = []
    if export.wandb.enabled:
        out.append("wandb")
    if export.mlflow.enabled:
        out.append("mlflow")
    return out


def export_section(config: Mapping[str, Any], *, where: str = "config.yaml") -> ExportSection:
    """The typed `export` section of a saved config."""
    from ckpteval.config.typed import from_mapping

    return from_mapping(ExportSection, config.get("export") or {}, where=where, path="export")


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

    The W&B key is `key` if given, else found from the environment or the user's `wandb login`.
    `environ` (default `os.environ`, never modified) supplies WANDB_MODE / WANDB_BASE_URL /
    MLFLOW_TRACKING_URI. Returns one outcome per destination; never raises for a destination's failure.
    """
    chosen = list(destinations) if destinations is not None else enabled_destinations(export)
    if not chosen:
        return []
    env = os.environ if environ is None else environ
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="ckpteval-export-") as scratch:
        content = _content(results, job_dir, config_file=config_file, task_dirs=task_dirs, scratch=Path(scratch))
        for destination in chosen:
            if destination == "wandb":
                outcome = _to_wandb(content, export, key=key, environ=env, wandb_dir=job_dir)
            else:
                outcome = _to_mlflow(content, export)
            if report is not None:
                report(outcome)
            outcomes.append(outcome)
    return outcomes


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


def _to_wandb(
    content: ExportContent, export: ExportSection, *, key: WandbKey | None, environ: Mapping[str, str], wandb_dir: Path
) -> ExportOutcome:
    mode = wandb_mode(environ)
    retry = f"evaluate export {content.invocation} --to wandb"
    if mode == "disabled":
        return ExportOutcome("wandb", "skipped", "WANDB_MODE=disabled: W&B export is off.")
    try:
        if mode == "online" and key is None:
            key = find_wandb_key(environ)
        if mode == "online" and key is None:
            return ExportOutcome(
                "wandb",
                "skipped",
                f"no W&B login found. {LOGIN_HINT} Then: {retry}",
            )
        if key is not None and mode == "online":
            announce_login(key)
        from ckpteval.export.to_wandb import export_to_wandb

        return export_to_wandb(
            content, export.wandb, key=key, mode=mode, base_url=wandb_base_url(environ), wandb_dir=wandb_dir
        )
    except ExportError as exc:
        return ExportOutcome("wandb", "failed", exc.message, hint=exc.hint or f"Retry with: {retry}")
    except OSError as exc:  # a result file vanished or the run directory is not writable
        return ExportOutcome("wandb", "failed", f"W&B export: {exc}", hint=f"Retry with: {retry}")


def _to_mlflow(content: ExportContent, export: ExportSection) -> ExportOutcome:
    retry = f"evaluate export {content.invocation} --to mlflow"
    try:
        from ckpteval.export.to_mlflow import export_to_mlflow

        return export_to_mlflow(content, export.mlflow)
    except ExportError as exc:
        return ExportOutcome("mlflow", "failed", exc.message, hint=exc.hint or f"Retry with: {retry}")
    except OSError as exc:
        return ExportOutcome("mlflow", "failed", f"MLflow export: {exc}", hint=f"Retry with: {retry}")
