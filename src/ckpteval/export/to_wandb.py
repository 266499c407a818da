"""Export an invocation to W&B: one run per invocation (or per task), metrics, config, results artifact.

Run ids are deterministic (`ckpteval-<invocation>`, per task `ckpteval-<invocation>-<task>`) and runs are
opened with `resume="allow"`, so exporting the same invocation again updates the same run instead of
making a second one: its summary and config are rewritten, its history is not logged twice, and the
results artifact gets a new version only if a file changed (W&B versions artifacts by content).

With `WANDB_MODE=offline` the run is written under `<job_dir>/wandb/offline-run-*` and the outcome
carries the `wandb sync` command that uploads it later.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.config.schema import WandbExport
from ckpteval.errors import ExportError
from ckpteval.export.content import ExportContent, metric_values, run_config, sample_tables, usage_values
from ckpteval.export.context import Curves, ExportContext
from ckpteval.export.credentials import (
    LOGIN_HINT,
    WandbKey,
    WandbMode,
    announce_login,
    find_wandb_key,
    wandb_base_url,
    wandb_mode,
)
from ckpteval.export.outcome import ExportOutcome

ARTIFACT_TYPE = "evaluation_result"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class WandbRunSpec:
    """One W&B run to write: its identity and what goes in it."""

    id: str
    name: str
    group: str
    artifact_name: str
    content: ExportContent


def _safe(text: str) -> str:
    return _UNSAFE.sub("-", text).strip("-") or "run"


def run_specs(content: ExportContent, settings: WandbExport) -> list[WandbRunSpec]:
    """The runs an invocation becomes: one (multi_task) or one per task (per_task)."""
    inv = content.invocation
    base_name = settings.name or content.results.label or f"eval-{inv}"
    group = settings.group or inv
    if settings.log_mode == "multi_task":
        return [
            WandbRunSpec(
                id=f"ckpteval-{inv}", name=base_name, group=group, artifact_name=f"results-{inv}", content=content
            )
        ]
    return [
        WandbRunSpec(
            id=f"ckpteval-{inv}-{_safe(task)}",
            name=f"{base_name}-{task}",
            group=group,
            artifact_name=f"results-{inv}-{_safe(task)}",
            content=content.for_task(task),
        )
        for task in content.results.tasks
    ]


def write_invocation(content: ExportContent, settings: WandbExport, context: ExportContext) -> ExportOutcome:
    """The invocation's W&B run(s), with the key handed in or found (environment, `wandb login`); skipped with
    WANDB_MODE=disabled or without a login online. Raises ExportError if W&B refuses or cannot be reached."""
    mode = wandb_mode(context.environ)
    if mode == "disabled":
        return ExportOutcome("wandb", "skipped", "WANDB_MODE=disabled: W&B export is off.")
    key = context.key
    if mode == "online" and key is None:
        key = find_wandb_key(context.environ)
    if mode == "online" and key is None:
        retry = f"evaluate export {content.invocation} --to wandb"
        return ExportOutcome("wandb", "skipped", f"no W&B login found. {LOGIN_HINT} Then: {retry}")
    if key is not None and mode == "online":
        announce_login(key)
    base_url = wandb_base_url(context.environ)
    return export_to_wandb(content, settings, key=key, mode=mode, base_url=base_url, wandb_dir=context.job_dir)


def export_to_wandb(
    content: ExportContent,
    settings: WandbExport,
    *,
    key: WandbKey | None,
    mode: WandbMode,
    base_url: str | None,
    wandb_dir: Path,
) -> ExportOutcome:
    """Write the invocation's run(s). Raises ExportError if W&B refuses or cannot be reached in time."""
    import wandb

    locations = []
    offline_dirs = []
    try:
        for spec in run_specs(content, settings):
            url, run_dir = _write_run(spec, settings, key=key, mode=mode, base_url=base_url, wandb_dir=wandb_dir)
            locations.append(url or run_dir)
            if mode == "offline":
                offline_dirs.append(run_dir)
    finally:
        # run.finish() returns before wandb's service has written the run file to the end: stop the
        # service, which waits for it, so "written" below is true (and `wandb sync` finds a whole run)
        wandb.teardown()
    if mode == "offline":
        sync = "wandb sync " + " ".join(shlex.quote(d) for d in offline_dirs)
        return ExportOutcome(
            destination="wandb",
            status="exported",
            message=f"W&B offline run written to {', '.join(offline_dirs)}; upload it with: {sync}",
            locations=tuple(offline_dirs),
            sync_command=sync,
        )
    return ExportOutcome(
        destination="wandb",
        status="exported",
        message="W&B run: " + ", ".join(locations),
        locations=tuple(locations),
    )


def wandb_settings(settings: WandbExport, *, key: WandbKey | None, mode: WandbMode, base_url: str | None) -> Any:
    """`wandb.Settings` for an export: quiet, no console capture, no system stats, bounded waits."""
    import wandb

    values: dict[str, Any] = {
        "mode": mode,
        "init_timeout": float(settings.timeout),
        "silent": True,
        "console": "off",
        "x_disable_stats": True,
        "x_disable_meta": True,
        "disable_git": True,
        "save_code": False,
        "x_save_requirements": False,
        # after init, uploads that stall must not hold the CLI (or the job) for long; what was not
        # uploaded stays in the run directory for `wandb sync`
        "finish_timeout": float(max(settings.timeout * 5, 60)),
    }
    if key is not None and mode == "online":
        values["api_key"] = key.value  # handed over in memory: os.environ is left alone
    if base_url:
        values["base_url"] = base_url
    return wandb.Settings(**values)


def _write_run(
    spec: WandbRunSpec,
    settings: WandbExport,
    *,
    key: WandbKey | None,
    mode: WandbMode,
    base_url: str | None,
    wandb_dir: Path,
) -> tuple[str | None, str]:
    import wandb
    from wandb.errors import Error as WandbError
    from wandb.sdk.mailbox.mailbox_handle import ServerResponseError

    wandb_dir.mkdir(parents=True, exist_ok=True)
    results = spec.content.results
    try:
        run = wandb.init(
            entity=settings.entity,
            project=settings.project,
            id=spec.id,
            name=spec.name,
            group=spec.group,
            job_type=settings.job_type,
            tags=list(settings.tags),
            notes=settings.description,
            config=run_config(spec.content),
            resume="allow" if mode == "online" else None,
            dir=str(wandb_dir),
            reinit="create_new",
            settings=wandb_settings(settings, key=key, mode=mode, base_url=base_url),
        )
    except (WandbError, ServerResponseError, TimeoutError) as exc:
        # a run that failed to start stays registered in wandb's service process ("run ID ... is in
        # use"); stopping the service lets a retry in this process start afresh
        wandb.teardown()
        raise ExportError(
            f"W&B did not accept run {spec.id}: {_first_line(exc)}",
            hint=f"Check that {base_url or 'W&B'} is reachable and your key is valid (`wandb login --relogin`); "
            f"the results stay on disk: retry with `evaluate export {spec.content.invocation} --to wandb`.",
        ) from None
    exit_code = 0 if results.status == "succeeded" else 1
    try:
        metrics = metric_values(results)
        if metrics and not run.resumed:  # a re-export must not add a second history row
            run.log(metrics, step=0)
        run.summary.update(metrics)
        run.summary.update(usage_values(results))  # what it cost: summary only (no step of its own)
        artifact = wandb.Artifact(
            spec.artifact_name,
            type=ARTIFACT_TYPE,
            description=f"ckpteval results of invocation {spec.content.invocation}",
            metadata={"invocation": spec.content.invocation, "status": results.status, "model": results.model},
        )
        for name, path in sorted(spec.content.files.items()):
            artifact.add_file(str(path), name=name)
        for task, table in sample_tables(spec.content).items():  # browsable per-sample scores
            artifact.add(wandb.Table(columns=list[str | int](table.columns), data=table.rows), f"samples/{_safe(task)}")
        run.log_artifact(artifact)
        url = run.url if mode == "online" else None
        run_dir = str(Path(run.dir).parent)  # <wandb_dir>/wandb/[offline-]run-<time>-<id>
    finally:
        run.finish(exit_code=exit_code)
    return url, run_dir


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def write_curves(curves: Curves, settings: WandbExport) -> str:
    """A watch run's points in W&B: in its own run (id `ckpteval-watch-<run>`, `step = iteration`), or, given the
    training's run, in that run under `eval/` against the `iteration` metric (its steps are past the
    checkpoint's). Points must come in iteration order: W&B drops a step lower than one already logged."""
    mode = wandb_mode(os.environ)
    if mode == "disabled":
        return "W&B: WANDB_MODE=disabled, not exported"
    key = find_wandb_key(os.environ) if mode == "online" else None
    if mode == "online" and key is None:
        raise ExportError("No W&B login found for the curves.", hint="Run `wandb login`, or set WANDB_MODE=offline.")
    import wandb
    from wandb.errors import Error as WandbError

    own = curves.own_run
    try:
        run = wandb.init(
            entity=settings.entity,
            project=settings.project,
            id=curves.run_id,
            name=curves.run if own else None,
            job_type="watch" if own else None,
            config=curves.config if own else None,
            resume="allow" if mode == "online" else None,
            dir=str(curves.directory),
            reinit="create_new",
            settings=wandb_settings(settings, key=key, mode=mode, base_url=wandb_base_url(os.environ)),
        )
    except (WandbError, TimeoutError) as exc:
        wandb.teardown()
        raise ExportError(f"W&B did not accept run {curves.run_id}: {exc}") from None
    try:
        run.define_metric("iteration")
        if own:
            for iteration, points in curves.points:
                run.log({"iteration": iteration, **points}, step=iteration)
        else:
            run.define_metric("eval/*", step_metric="iteration")
            for iteration, points in curves.points:
                run.log({"iteration": iteration, **{f"eval/{k}": v for k, v in points.items()}})
        where = run.url if mode == "online" else str(Path(run.dir).parent)
    finally:
        run.finish()
        wandb.teardown()  # waits until the run file is written to the end
    its = ", ".join(str(iteration) for iteration, _ in curves.points)
    return f"W&B run {curves.run_id}: iteration {its} ({where})"
