"""A watch run's scores as curves over iterations: in every export destination that draws curves, a table, a plot.

Each checkpoint's scores go out with its verdicts against the previous and the best checkpoint
(`<task>/<metric>/vs_previous/delta`, `.../verdict`: +1 better, -1 worse, 0 none), so they line up with the
training's loss. The destinations write them (`export.destinations`: W&B's `to_wandb.write_curves`, one run
per watch run, or the training's own with `--wandb-run-id`; MLflow's `to_mlflow.write_curves`, one run tagged
`ckpteval.watch=<run>`). Points arrive in iteration order (the watcher holds a later one back until the
earlier ones are resolved), because W&B drops a step lower than one already logged.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from pathlib import Path
from typing import Any

from ckpteval.config.schema import ExportSection
from ckpteval.errors import ExportError
from ckpteval.watch.state import IterationEntry, WatchState, watch_dir


def wandb_run_id(state: WatchState) -> str:
    return state.spec.wandb_run_id or f"ckpteval-watch-{state.run}"


def export_curves(state: WatchState, entries: list[IterationEntry], export: ExportSection) -> str | None:
    """Add `entries`' scores to the run's curves in every destination `export` enables that draws curves
    (`export.destinations`); returns what was done, for the user."""
    from ckpteval.export.context import Curves
    from ckpteval.export.destinations import destinations

    curves = Curves(
        run=state.run,
        run_id=wandb_run_id(state),
        own_run=state.spec.wandb_run_id is None,
        config={"watch": {"run": state.run, "save_dir": state.spec.save_dir, "tasks": state.spec.tasks}},
        points=[(entry.iteration, _points(entry)) for entry in entries],
        directory=watch_dir() / state.run,
    )
    done = [d.curves(curves, d.settings(export)) for d in destinations() if d.curves is not None and d.enabled(export)]
    return "; ".join(done) or None


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
    """One row per evaluated save: iteration, state, the content served, invocation, and each score with its
    stderr (an iteration a training rewrote has a row per save, the earlier one first)."""
    rows = []
    entries = [*state.rewritten, *state.iterations.values()]  # a rewritten iteration: its earlier save first
    for entry in sorted(entries, key=lambda e: e.iteration):
        row: dict[str, Any] = {
            "iteration": entry.iteration,
            "state": f"{entry.state} (saved again since)" if entry in state.rewritten else entry.state,
            "content": entry.content,
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
