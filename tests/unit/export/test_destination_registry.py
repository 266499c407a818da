"""A destination plugs in through the registry alone: a test double (a JSON-lines notebook on disk) registered
with `register_destination` receives an invocation's export and a watch run's curves, with no other edit;
its failure becomes a failed outcome with the retry command, like W&B's and MLflow's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckpteval.config.schema import ExportSection
from ckpteval.errors import ExportError
from ckpteval.export.content import ExportContent, metric_values
from ckpteval.export.context import Curves, ExportContext
from ckpteval.export.destinations import ExportDestination, register_destination, unregister_destination
from ckpteval.export.invocation import enabled_destinations, export_invocation
from ckpteval.export.outcome import ExportOutcome
from ckpteval.results.model import InvocationResults
from ckpteval.watch.curves import export_curves
from ckpteval.watch.state import IterationEntry, WatchSpec, WatchState
from tests.support.jobdirs import compiled_config_yaml, make_job_dir, sample_results


@dataclass(frozen=True)
class NotebookSettings:
    enabled: bool
    path: Path


def _write(content: ExportContent, settings: NotebookSettings, context: ExportContext) -> ExportOutcome:
    with settings.path.open("a") as notebook:
        notebook.write(json.dumps({"invocation": content.invocation, "metrics": metric_values(content.results)}) + "\n")
    return ExportOutcome("notebook", "exported", f"notebook {settings.path}", locations=(str(settings.path),))


def _curves(curves: Curves, settings: NotebookSettings) -> str:
    with settings.path.open("a") as notebook:
        for iteration, points in curves.points:
            notebook.write(json.dumps({"run": curves.run, "iteration": iteration, "points": points}) + "\n")
    return f"notebook: {len(curves.points)} point(s)"


@pytest.fixture
def notebook(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "notebook.jsonl"
    settings = NotebookSettings(enabled=True, path=path)
    register_destination(ExportDestination("notebook", "Notebook", lambda export: settings, _write, _curves))
    yield path
    unregister_destination("notebook")


def _job(tmp_path: Path, invocation: str) -> InvocationResults:
    config = compiled_config_yaml([])
    return make_job_dir(tmp_path / "job", invocation, config_yaml=config, results=sample_results(invocation))


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_registered_destination_is_enabled_by_its_section_and_gets_the_export(notebook: Path, tmp_path: Path):
    export = ExportSection()  # W&B and MLflow off: only the notebook's section says enabled
    assert enabled_destinations(export) == ["notebook"]
    results = make_job_dir(
        tmp_path / "job", "5a5b5c5d", config_yaml=compiled_config_yaml([]), results=sample_results("5a5b5c5d")
    )
    (outcome,) = export_invocation(results, tmp_path / "job", export, environ={})
    assert (outcome.destination, outcome.status, outcome.locations) == ("notebook", "exported", (str(notebook),))
    (line,) = _lines(notebook)
    assert line["invocation"] == "5a5b5c5d"
    assert line["metrics"] and all("/" in key for key in line["metrics"])


def test_a_registered_destination_draws_a_watch_runs_curves(notebook: Path):
    spec = WatchSpec(save_dir="/s", configs=["tiny"], profile=None, tasks=["hellaswag"], overrides=[])
    state = WatchState(run="run7-abcdef", spec=spec, created=0.0)
    for i, acc in ((100, 0.25), (200, 0.5)):
        state.iterations[i] = IterationEntry(i, f"/s/iter_{i:07d}", "succeeded", 0.0, metrics={"hellaswag/acc": acc})
    entries = [state.iterations[100], state.iterations[200]]
    assert export_curves(state, entries, ExportSection()) == "notebook: 2 point(s)"
    lines = _lines(notebook)
    assert [(line["run"], line["iteration"], line["points"]["hellaswag/acc"]) for line in lines] == [
        ("run7-abcdef", 100, 0.25),
        ("run7-abcdef", 200, 0.5),
    ]


def test_a_destination_that_fails_ends_in_a_failed_outcome_with_the_retry_command(tmp_path: Path):
    def refuse(content: ExportContent, settings: Any, context: ExportContext) -> ExportOutcome:
        raise ExportError("the notebook is full.")

    register_destination(ExportDestination("full", "Full", lambda export: None, refuse))
    try:
        results = make_job_dir(
            tmp_path / "job", "6a6b6c6d", config_yaml=compiled_config_yaml([]), results=sample_results("6a6b6c6d")
        )
        (outcome,) = export_invocation(results, tmp_path / "job", ExportSection(), destinations=["full"], environ={})
    finally:
        unregister_destination("full")
    assert (outcome.status, outcome.message) == ("failed", "the notebook is full.")
    assert outcome.hint == "Retry with: evaluate export 6a6b6c6d --to full"
