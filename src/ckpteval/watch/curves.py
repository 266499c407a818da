"""A watch run's scores as curves over iterations: one W&B run and one MLflow run, a table, a plot.

W&B: one run per watch run (id `ckpteval-watch-<run>`), each checkpoint's scores logged with
`step = iteration` (plus an `iteration` key) with its verdicts against the previous and the best
checkpoint (`<task>/<metric>/vs_previous/delta`, `.../verdict`: +1 better, -1 worse, 0 none), so they
line up with the training's loss. Given the
training's own run id (`--wandb-run-id`), the scores go into that run instead, keyed `eval/<task>/<metric>`
against the `iteration` metric (`define_metric`), since its steps are already past the checkpoint's.
Points arrive in iteration order (the watcher holds a later one back until the earlier ones are resolved),
because W&B drops a step lower than one already logged. MLflow: one run tagged `ckpteval.watch=<run>`,
each metric logged at `step = iteration`.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import os
import time
from pathlib import Path
from typing import Any

from ckpteval.config.schema import ExportSection
from ckpteval.errors import ExportError
from ckpteval.watch.state import IterationEntry, WatchState, watch_dir

WATCH_TAG = "ckpteval.watch"


def wandb_run_id(state: WatchState) -> str:
    return state.spec.wandb_run_id or f"ckpteval-watch-{state.run}"


def export_curves(state: WatchState, entries: list[IterationEntry], export: ExportSection) -> str | None:
    """Add `entries`' scores to the run's curves where `export` says; returns what was done, for the user."""
    done = []
    if export.wandb.enabled:
        done.append(_to_wandb(state, entries, export))
    if export.mlflow.enabled:
        done.append(_to_mlflow(state, entries, export))
    return "; ".join(done) or None


def _to_wandb(state: WatchState, entries: list[IterationEntry], export: ExportSection) -> str:
    from ckpteval.export.credentials import find_wandb_key, wandb_base_url, wandb_mode
    from ckpteval.export.to_wandb import wandb_settings

    mode = wandb_mode(os.environ)
    if mode == "disabled":
        return "W&B: WANDB_MODE=disabled, not exported"
    key = find_wandb_key(os.environ) if mode == "online" else None
    if mode == "online" and key is None:
        raise ExportError("No W&B login found for the curves.", hint="Run `wandb login`, or set WANDB_MODE=offline.")
    import wandb
    from wandb.errors import Error as WandbError

    settings = export.wandb
    own = state.spec.wandb_run_id is None
    wandb_dir = watch_dir() / state.run
    try:
        run = wandb.init(
            entity=settings.entity,
            project=settings.project,
            id=wandb_run_id(state),
            name=state.run if own else None,
            job_type="watch" if own else None,
            config={"watch": {"run": state.run, "save_dir": state.spec.save_dir, "tasks": state.spec.tasks}}
            if own
            else None,
            resume="allow" if mode == "online" else None,
            dir=str(wandb_dir),
            reinit="create_new",
            settings=wandb_settings(settings, key=key, mode=mode, base_url=wandb_base_url(os.environ)),
        )
    except (WandbError, TimeoutError) as exc:
        wandb.teardown()
        raise ExportError(f"W&B did not accept run {wandb_run_id(state)}: {exc}") from None
    try:
        if own:
            run.define_metric("iteration")
            for entry in entries:
                run.log({"iteration": entry.iteration, **_points(entry)}, step=entry.iteration)
        else:
            run.define_metric("iteration")
            run.define_metric("eval/*", step_metric="iteration")
            for entry in entries:
                run.log({"iteration": entry.iteration, **{f"eval/{k}": v for k, v in _points(entry).items()}})
        where = run.url if mode == "online" else str(Path(run.dir).parent)
    finally:
        run.finish()
        wandb.teardown()  # waits until the run file is written to the end
    its = ", ".join(str(e.iteration) for e in entries)
    return f"W&B run {wandb_run_id(state)}: iteration {its} ({where})"


def _to_mlflow(state: WatchState, entries: list[IterationEntry], export: ExportSection) -> str:
    from ckpteval.export.to_mlflow import tracking_uri

    uri = tracking_uri(export.mlflow)
    from mlflow.entities import Metric
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        name = export.mlflow.experiment_name
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        found = client.search_runs([experiment_id], filter_string=f"tags.`{WATCH_TAG}` = '{state.run}'", max_results=1)
        run = found[0] if found else client.create_run(experiment_id, run_name=state.run, tags={WATCH_TAG: state.run})
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, e.iteration) for e in entries for k, v in _points(e).items()]
        for i in range(0, len(metrics), 1000):
            client.log_batch(run.info.run_id, metrics=metrics[i : i + 1000])
    except MlflowException as exc:
        raise ExportError(f"MLflow ({uri}) refused the curves: {str(exc).strip().splitlines()[0]}") from None
    return f"MLflow run {run.info.run_id}: {len(entries)} iteration(s)"


def _points(entry: IterationEntry) -> dict[str, float]:
    """What one checkpoint adds to the curves: its scores, and its verdicts against the previous checkpoint
    and the best so far (`<task>/<metric>/vs_previous/delta`, ...; see `watch.verdicts`)."""
    from ckpteval.watch.verdicts import verdict_metrics

    return {**entry.metrics, **verdict_metrics(entry)}


def score_columns(state: WatchState) -> list[str]:
    """The `<task>/<metric>` keys that have a value in any iteration (stderr and counts left out)."""
    keys: dict[str, None] = {}
    for entry in sorted(state.iterations.values(), key=lambda e: e.iteration):
        for key in entry.metrics:
            if not key.endswith(("_stderr", "_std_dev", "/n_samples")):
                keys.setdefault(key)
    return list(keys)


def curve_rows(state: WatchState) -> list[dict[str, Any]]:
    """One row per iteration: iteration, state, invocation, and each score with its stderr."""
    rows = []
    for entry in sorted(state.iterations.values(), key=lambda e: e.iteration):
        row: dict[str, Any] = {
            "iteration": entry.iteration,
            "state": entry.state,
            "invocation": entry.current.invocation if entry.current else None,
            "attempts": len(entry.attempts),
            "note": entry.note,
            "scores": {
                k: (entry.metrics[k], entry.metrics.get(f"{k}_stderr"))
                for k in score_columns(state)
                if k in entry.metrics
            },
        }
        rows.append(row)
    return rows


def plot_curves(state: WatchState, path: Path) -> Path:
    """A PNG with one panel per score against iteration, a band of +-1 stderr where known."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = score_columns(state)
    if not columns:
        raise ExportError(f"Watch run {state.run} has no scores yet: nothing to plot.")
    done = sorted((e for e in state.iterations.values() if e.state == "succeeded"), key=lambda e: e.iteration)
    fig, axes = plt.subplots(len(columns), 1, figsize=(7, 2.6 * len(columns)), squeeze=False)
    for ax, key in zip(axes[:, 0], columns, strict=True):
        points = [(e.iteration, e.metrics[key], e.metrics.get(f"{key}_stderr")) for e in done if key in e.metrics]
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        ax.plot(xs, ys, marker="o")
        if all(p[2] is not None for p in points):
            lo = [y - (s or 0.0) for _, y, s in points]
            hi = [y + (s or 0.0) for _, y, s in points]
            ax.fill_between(xs, lo, hi, alpha=0.25, label="± 1 stderr")
            ax.legend(loc="best", fontsize="small")
        ax.set_title(key, fontsize="medium")
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    fig.suptitle(f"watch run {state.run}", fontsize="medium")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
