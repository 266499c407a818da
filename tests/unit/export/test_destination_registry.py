"""A destination plugs in through the registry alone: a test double (a JSON-lines notebook on disk) with a
config section of its own, registered with `register_destination` from this file, is set in a config like
W&B (`export.notebook.enabled=true export.notebook.path=...`, its keys checked), and receives an invocation's
export and a watch run's curves, with no other edit; its failure becomes a failed outcome with the retry
command, like W&B's and MLflow's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.config.schema import ExportSection
from ckpteval.errors import ConfigError, ExportError
from ckpteval.export.content import ExportContent, metric_values
from ckpteval.export.context import Curves, ExportContext
from ckpteval.export.destinations import ExportDestination, register_destination, unregister_destination
from ckpteval.export.invocation import enabled_destinations, export_invocation, export_section
from ckpteval.export.outcome import ExportOutcome
from ckpteval.results.model import InvocationResults
from ckpteval.watch.curves import export_curves
from ckpteval.watch.state import IterationEntry, WatchSpec, WatchState
from tests.support.jobdirs import compiled_config_yaml, make_job_dir, sample_results


@dataclass(frozen=True, kw_only=True)
class NotebookSettings:
    """The double's section: `export.notebook.*`."""

    enabled: bool = False
    path: str = ""

    def check(self) -> None:
        """Called when a config is compiled, as W&B's section checks for a project."""
        if self.enabled and not self.path:
            raise ConfigError("export.notebook is enabled but has no path.", hint="Set export.notebook.path=FILE.")


def _write(content: ExportContent, settings: NotebookSettings, context: ExportContext) -> ExportOutcome:
    with Path(settings.path).open("a") as notebook:
        notebook.write(json.dumps({"invocation": content.invocation, "metrics": metric_values(content.results)}) + "\n")
    return ExportOutcome("notebook", "exported", f"notebook {settings.path}", locations=(str(settings.path),))


def _curves(curves: Curves, settings: NotebookSettings) -> str:
    with Path(settings.path).open("a") as notebook:
        for iteration, points in curves.points:
            notebook.write(json.dumps({"run": curves.run, "iteration": iteration, "points": points}) + "\n")
    return f"notebook: {len(curves.points)} point(s)"


@pytest.fixture
def notebook(tmp_path: Path) -> Iterator[Path]:
    register_destination(ExportDestination("notebook", "Notebook", NotebookSettings, _write, _curves))
    yield tmp_path / "notebook.jsonl"
    unregister_destination("notebook")


def _job(tmp_path: Path, invocation: str) -> InvocationResults:
    config = compiled_config_yaml([])
    return make_job_dir(tmp_path / "job", invocation, config_yaml=config, results=sample_results(invocation))


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_config_turns_it_on_with_its_own_keys_and_it_gets_the_export(notebook: Path, tmp_path: Path):
    compiled = compile_config(
        CompileRequest(
            configs=("tiny",), overrides=("export.notebook.enabled=true", f"export.notebook.path={notebook}")
        )
    )
    export = compiled.config.export
    assert export.notebook == NotebookSettings(enabled=True, path=str(notebook))
    assert compiled.data["export"]["notebook"] == {"enabled": True, "path": str(notebook)}  # saved with the config
    assert enabled_destinations(export) == ["notebook"]  # W&B and MLflow off: only the notebook's section says so
    results = make_job_dir(
        tmp_path / "job", "5a5b5c5d", config_yaml=compiled_config_yaml([]), results=sample_results("5a5b5c5d")
    )
    (outcome,) = export_invocation(results, tmp_path / "job", export, environ={})
    assert (outcome.destination, outcome.status, outcome.locations) == ("notebook", "exported", (str(notebook),))
    (line,) = _lines(notebook)
    assert line["invocation"] == "5a5b5c5d"
    assert line["metrics"] and all("/" in key for key in line["metrics"])


def test_a_saved_config_names_it_as_the_export_step_reads_it(notebook: Path):
    saved = {"export": {"wandb": {"enabled": False}, "notebook": {"enabled": True, "path": str(notebook)}}}
    export = export_section(saved)
    assert export.notebook == NotebookSettings(enabled=True, path=str(notebook))
    assert export.mlflow.enabled is False  # a destination the config does not name: its section's defaults


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("export.notebook.enabled=maybe", "'export.notebook.enabled' must be true or false, not 'maybe'"),
        ("export.notebook.pth=x", "Did you mean export.notebook.path=x?"),
        ("+export.notebook.pth=x", "unknown key 'export.notebook.pth'. Did you mean 'path'?"),
        ("+export.notebok.enabled=true", "unknown key 'export.notebok'. Did you mean 'notebook'?"),
        ("export.notebook.enabled=true", "export.notebook is enabled but has no path. Set export.notebook.path=FILE."),
    ],
)
def test_its_keys_are_checked_like_wandbs(notebook: Path, override: str, message: str):
    with pytest.raises(ConfigError) as refused:
        compile_config(CompileRequest(configs=("tiny",), overrides=(override,)))
    assert message in f"{refused.value.message} {refused.value.hint}"


def test_unregistered_a_config_naming_it_is_refused_again():
    register_destination(ExportDestination("notebook", "Notebook", NotebookSettings, _write))
    unregister_destination("notebook")
    with pytest.raises(ConfigError, match=r"unknown key 'export\.notebook'"):
        compile_config(CompileRequest(configs=("tiny",), overrides=("+export.notebook.enabled=true",)))


def test_an_export_where_it_is_not_registered_fails_for_it_and_says_where_to_export_from(
    notebook: Path, tmp_path: Path
):
    """A Slurm job's export step runs without the code that registered the destination: it exports to the
    others and reports this one as failed, rather than refusing the saved config."""
    ledger = tmp_path / "ledger.jsonl"
    register_destination(ExportDestination("ledger", "Ledger", NotebookSettings, _write))
    try:
        overrides = ("export.notebook.enabled=true", f"export.notebook.path={notebook}")
        overrides += ("export.ledger.enabled=true", f"export.ledger.path={ledger}")
        saved = compile_config(CompileRequest(configs=("tiny",), overrides=overrides)).data
        unregister_destination("notebook")  # the job's export step: only ledger is registered there
        export = export_section(saved)
        assert (export.unregistered, enabled_destinations(export)) == (("notebook",), ["ledger"])
        results = make_job_dir(
            tmp_path / "job", "4a4b4c4d", config_yaml=compiled_config_yaml([]), results=sample_results("4a4b4c4d")
        )
        unregistered, exported = export_invocation(results, tmp_path / "job", export, environ={})
    finally:
        unregister_destination("ledger")
    assert (unregistered.destination, unregistered.status, exported.status) == ("notebook", "failed", "exported")
    assert unregistered.message == (
        "export.notebook is enabled, but no destination 'notebook' is registered where this export ran."
    )
    assert unregistered.hint == "Export it from the code that registers it: ckpteval.export('4a4b4c4d', ['notebook'])."
    assert not notebook.exists()
    assert [line["invocation"] for line in _lines(ledger)] == ["4a4b4c4d"]


def test_a_registered_destination_draws_a_watch_runs_curves(notebook: Path):
    spec = WatchSpec(save_dir="/s", configs=["tiny"], profile=None, tasks=["hellaswag"], overrides=[])
    state = WatchState(run="run7-abcdef", spec=spec, created=0.0)
    for i, acc in ((100, 0.25), (200, 0.5)):
        state.iterations[i] = IterationEntry(i, f"/s/iter_{i:07d}", "succeeded", 0.0, metrics={"hellaswag/acc": acc})
    entries = [state.iterations[100], state.iterations[200]]
    export = ExportSection(notebook=NotebookSettings(enabled=True, path=str(notebook)))
    assert export_curves(state, entries, export) == "notebook: 2 point(s)"
    lines = _lines(notebook)
    assert [(line["run"], line["iteration"], line["points"]["hellaswag/acc"]) for line in lines] == [
        ("run7-abcdef", 100, 0.25),
        ("run7-abcdef", 200, 0.5),
    ]


def test_a_destination_that_fails_ends_in_a_failed_outcome_with_the_retry_command(tmp_path: Path):
    def refuse(content: ExportContent, settings: Any, context: ExportContext) -> ExportOutcome:
        raise ExportError("the notebook is full.")

    @dataclass(frozen=True)
    class FullSettings:
        enabled: bool = False

    register_destination(ExportDestination("full", "Full", FullSettings, refuse))
    try:
        results = make_job_dir(
            tmp_path / "job", "6a6b6c6d", config_yaml=compiled_config_yaml([]), results=sample_results("6a6b6c6d")
        )
        (outcome,) = export_invocation(results, tmp_path / "job", ExportSection(), destinations=["full"], environ={})
    finally:
        unregister_destination("full")
    assert (outcome.status, outcome.message) == ("failed", "the notebook is full.")
    assert outcome.hint == "Retry with: evaluate export 6a6b6c6d --to full"


def test_the_packaged_default_declares_every_shipped_section():
    """Composing adds a section's defaults only for destinations registered beyond the shipped ones."""
    import yaml

    from ckpteval.config.compose import PACKAGED_CONF
    from ckpteval.config.schema import SHIPPED_EXPORT_SECTIONS

    default = yaml.safe_load((PACKAGED_CONF / "default.yaml").read_text())
    assert set(default["export"]) == SHIPPED_EXPORT_SECTIONS == {"wandb", "mlflow"}
