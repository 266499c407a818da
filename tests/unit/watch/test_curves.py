"""Curves: the W&B offline run read back (one point per iteration, step = iteration), the same in MLflow
(a real file store), the training's own run keyed against `iteration`, the table and the PNG."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpteval.config.schema import ExportSection, MlflowExport, WandbExport
from ckpteval.watch.curves import curve_rows, export_curves, plot_curves, score_columns, wandb_run_id
from ckpteval.watch.state import IterationEntry, WatchSpec, WatchState, watch_dir
from tests.support.wandb_offline import offline_run_dirs, read_offline_run
from tests.unit.export.conftest import wandb_home  # noqa: F401  (own HOME, no W&B settings leaking in)


def _state(*, wandb_run_id: str | None = None) -> WatchState:
    spec = WatchSpec(
        save_dir="/s", configs=["tiny"], profile=None, tasks=["hellaswag"], overrides=[], wandb_run_id=wandb_run_id
    )
    state = WatchState(run="run42-abcdef", spec=spec, created=0.0)
    for i, acc in ((100, 0.25), (200, 0.3), (300, 0.4)):
        metrics = {"hellaswag/acc": acc, "hellaswag/acc_stderr": 0.02, "hellaswag/n_samples": 50.0}
        state.iterations[i] = IterationEntry(i, f"/s/iter_{i:07d}", "succeeded", 0.0, metrics=metrics)
    state.iterations[400] = IterationEntry(400, "/s/iter_0000400", "failed", 0.0, note="3 attempts failed")
    return state


def _export(**kw) -> ExportSection:  # type: ignore[no-untyped-def]
    return ExportSection(wandb=WandbExport(enabled=True, project="p", **kw), mlflow=MlflowExport(enabled=False))


def _history(state: WatchState) -> list[dict]:
    rows = []
    for run_dir in offline_run_dirs(watch_dir() / state.run):
        run = read_offline_run(run_dir)
        assert run.run_id == wandb_run_id(state)
        rows.extend(run.history)
    return rows


def test_wandb_one_point_per_iteration_with_step_iteration(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    state = _state()
    entries = [state.iterations[i] for i in (100, 200)]
    assert "iteration 100, 200" in (export_curves(state, entries, _export()) or "")
    export_curves(state, [state.iterations[300]], _export())  # a later poll: the same run, one more point
    history = _history(state)
    assert [(h["_step"], h["iteration"], h["hellaswag/acc"]) for h in history] == [
        (100, 100, 0.25),
        (200, 200, 0.3),
        (300, 300, 0.4),
    ]
    assert history[0]["hellaswag/acc_stderr"] == 0.02


def test_into_the_trainings_own_run_the_scores_are_keyed_against_iteration(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    state = _state(wandb_run_id="train-run-7")
    export_curves(state, [state.iterations[100]], _export())
    [row] = _history(state)
    assert row["iteration"] == 100 and row["eval/hellaswag/acc"] == 0.25
    assert "hellaswag/acc" not in row


def test_mlflow_metrics_at_step_iteration(tmp_path: Path):
    from mlflow.tracking import MlflowClient  # a runtime dependency: a broken install fails here, never skips

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    state = _state()
    export = ExportSection(
        wandb=WandbExport(enabled=False), mlflow=MlflowExport(enabled=True, tracking_uri=uri, experiment_name="w")
    )
    export_curves(state, [state.iterations[100], state.iterations[200]], export)
    export_curves(state, [state.iterations[300]], export)
    client = MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("w").experiment_id])
    points = client.get_metric_history(run.info.run_id, "hellaswag/acc")
    assert sorted((p.step, p.value) for p in points) == [(100, 0.25), (200, 0.3), (300, 0.4)]


def test_table_rows_and_plot(tmp_path: Path):
    state = _state()
    assert score_columns(state) == ["hellaswag/acc"]
    rows = curve_rows(state)
    assert [r["iteration"] for r in rows] == [100, 200, 300, 400]
    assert rows[0]["scores"] == {"hellaswag/acc": (0.25, 0.02)}
    assert rows[3]["state"] == "failed" and rows[3]["scores"] == {}
    png = plot_curves(state, tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_verdicts_are_step_indexed_metrics_beside_the_scores(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    state = _state()
    row = {"task": "hellaswag", "metric": "acc", "against": 100, "delta": 0.05, "ci_low": 0.01, "ci_high": 0.09}
    row |= {"mde": 0.03, "n": 50, "verdict": "better", "tested": True, "note": "", "p_adjusted": 0.01}
    state.iterations[200].verdicts = {"previous": [row], "best": [row]}
    export_curves(state, [state.iterations[100], state.iterations[200]], _export())
    first, second = _history(state)
    assert "hellaswag/acc/vs_previous/delta" not in first  # the first checkpoint has nothing to compare with
    assert second["_step"] == 200 and second["hellaswag/acc/vs_previous/delta"] == 0.05
    assert second["hellaswag/acc/vs_best/verdict"] == 1.0 and second["hellaswag/acc/vs_previous/mde"] == 0.03
