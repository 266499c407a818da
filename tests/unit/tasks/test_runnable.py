"""Whether a task can run where its job runs is decided before anything is written, in the dry run as in the
run: a harness not installed here, an endpoint type the deployment does not serve, data not readable here
(tests/unit/tasks/test_local_data_cache.py) each refuse the task in one line with the fix."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

import ckpteval
from ckpteval.cli.main import app
from ckpteval.tasks import runnable
from ckpteval.tasks.catalog import load_catalog
from ckpteval.tasks.runnable import endpoint_served, harness_installed, runs_here


def _invoke(argv: list[str], width: int = 80):
    return CliRunner().invoke(app, argv, terminal_width=width, env={"COLUMNS": str(width)})


@pytest.mark.parametrize("dry_run", [["--dry-run"], []])
def test_a_task_whose_harness_is_not_installed_here_is_refused_with_the_install_line(
    isolated_user: Path, dry_run: list[str]
) -> None:
    result = _invoke(["-c", "tiny", "-t", "simple_evals.mmlu_pro", *dry_run])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines[0].startswith("error: Task mmlu_pro cannot run here: its harness (simple_evals) is not installed")
    assert "nvidia-simple-evals" in result.output and "--run PROFILE" in result.output
    assert "Traceback" not in result.output and "#!/usr/bin/env bash" not in result.output  # before the preview
    assert ckpteval.statuses() == []  # nothing recorded, no job started
    assert not (isolated_user / "results").exists()


def test_a_harness_one_of_ckptevals_extras_installs_names_the_extra(
    isolated_user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as on a machine synced without `--extra judge` (CI syncs with it)
    monkeypatch.setattr(runnable, "installed_harness_packages", lambda: frozenset({"lm_evaluation_harness"}))
    result = _invoke(["-c", "tiny", "-t", "mtbench", "judge=self", "--dry-run"], 200)
    assert result.exit_code == 2, result.output
    assert "Task mtbench cannot run here: its harness (mtbench) is not installed" in result.output
    assert "uv sync --extra judge" in result.output
    assert runs_here(load_catalog().get("mtbench")) == "needs --extra judge"


def test_several_tasks_that_cannot_run_are_refused_together_one_line_each(isolated_user: Path) -> None:
    tasks = "bigcode-evaluation-harness.humaneval,simple_evals.mmlu_pro,nemo_skills.ns_mmlu_pro,adlr_mmlu"
    result = _invoke(["-c", "tiny", "-t", tasks], 200)
    assert result.exit_code == 2, result.output
    out = result.output
    assert out.startswith("error: 3 tasks cannot run here:")
    assert "  humaneval: " in out and "  mmlu_pro: " in out and "  ns_mmlu_pro: " in out and "adlr_mmlu" not in out
    assert "nvidia-simple-evals" in out and "nvidia-bigcode-eval" in out
    # a harness with no package to install: only its container runs it
    ns_line = next(ln for ln in out.splitlines() if ln.startswith("  ns_mmlu_pro: "))
    assert "package" not in ns_line and "Slurm profile" in ns_line


def test_a_chat_task_against_an_endpoint_that_serves_only_completions_is_refused(isolated_user: Path) -> None:
    argv = ["-c", "tiny", "deployment=none", "target.api_endpoint.url=http://127.0.0.1:9/generate"]
    result = _invoke([*argv, "-t", "mmlu_instruct", "--dry-run"], 200)
    assert result.exit_code == 2, result.output
    assert "Task mmlu_instruct cannot run here: it needs a chat endpoint; the deployment serves completions only" in (
        result.output
    )
    assert "target.api_endpoint.type=chat" in result.output
    # the same URL ending in the completions route: the chat route beside it is served
    routed = ["-c", "tiny", "deployment=none", "target.api_endpoint.url=http://127.0.0.1:9/v1/completions"]
    result = _invoke([*routed, "-t", "mmlu_instruct", "--dry-run"], 200)
    assert result.exit_code == 0, result.output


def test_each_requirement_alone() -> None:
    catalog = load_catalog()
    missing, mmlu, mtbench = catalog.get("simple_evals.mmlu_pro"), catalog.get("adlr_mmlu"), catalog.get("mtbench")
    assert harness_installed(missing, in_container=True) is None  # its eval-factory image has it
    assert harness_installed(mmlu, in_container=False) is None  # nvidia-lm-eval is a dependency
    unmet = harness_installed(missing, in_container=False)
    assert unmet is not None and unmet.requirement == "harness"
    assert endpoint_served(mtbench, "chat", ("completions", "chat")) is None
    assert endpoint_served(mtbench, "chat", ("completions",)) is not None
    assert (runs_here(mmlu), runs_here(missing)) == ("yes", "needs nvidia-simple-evals")


@pytest.mark.parametrize("width", [80, 140])
def test_evaluate_tasks_says_which_run_here_and_what_each_is(isolated_user: Path, width: int) -> None:
    result = _invoke(["tasks", "mtbench"], width)
    assert result.exit_code == 0, result.output
    installed = importlib.util.find_spec("core_evals.mtbench") is not None
    assert ("runs here" if installed else "needs --extra judge") in result.output
    assert "Standard MT-Bench" in result.output and "Corrected MT-Bench" in result.output  # the descriptions
    assert all(len(ln.rstrip()) <= width for ln in result.output.splitlines())
    result = _invoke(["tasks", "adlr_mmlu"], width)
    assert "runs here" in result.output or " yes " in result.output


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["tasks", "mt-bench"], "close: mtbench.mtbench"),
        (["tasks", "--harness", "lm-eval"], "Did you mean --harness lm-evaluation-harness?"),
        (["tasks", "mmlu", "--harness", "mtbench"], "No task of mtbench has 'mmlu' in its name"),
    ],
)
def test_no_task_found_says_what_to_try(isolated_user: Path, argv: list[str], hint: str) -> None:
    result = _invoke(argv)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("0 tasks\n") and hint in result.output.replace("\n", " ")
