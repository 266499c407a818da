"""A local run reads the dataset cache (`evaluate data fetch`) for a task whose datasets are all in it."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.job.build import Toolchain, build_plan
from ckpteval.tasks.data_cache import manifest_rel
from ckpteval.tasks.datasets import DatasetRef


def plan_env(tmp_path: Path, *tasks: str) -> dict[str, dict[str, str]]:
    compiled = compile_config(CompileRequest(configs=("tiny",), tasks=tasks))
    toolchain = Toolchain(python="python3", evaluator="nemo-evaluator")
    plan = build_plan(
        compiled, invocation="i", job_dir=str(tmp_path / "job"), toolchain=toolchain, launcher="processes"
    )
    return {t.name: t.runs[0].step.env for t in plan.tasks}


def test_a_cached_task_reads_the_cache_with_the_hub_off(isolated_user: Path, tmp_path: Path) -> None:
    cache = Path(os.environ["CKPTEVAL_DATA_CACHE"])
    manifest = cache / manifest_rel(DatasetRef("baber/piqa"))
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"files": {}, "links": {}}))
    env = plan_env(tmp_path, "piqa", "adlr_arc_challenge_llama_25_shot")
    assert env["piqa"]["HF_HOME"] == str(cache) and env["piqa"]["HF_HUB_OFFLINE"] == "1"
    assert env["piqa"]["CKPTEVAL_OFFLINE_DATA"] == "off"
    assert "HF_HOME" not in env["adlr_arc_challenge_llama_25_shot"]  # not cached: the harness downloads it


# -- a run on this machine that needs the hub, which does not answer: refused before anything is written -----


def closed_port_url() -> str:
    """An HF_ENDPOINT nothing listens on (the port was just free)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def hub_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub switched on (unit tests run with it off), at an address nothing listens on."""
    for switch in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(switch, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())


def compiled_for(*tasks: str, overrides: tuple[str, ...] = ()):
    return compile_config(CompileRequest(configs=("tiny",), tasks=tasks, overrides=overrides))


def test_a_local_run_whose_task_needs_an_unreachable_hub_is_refused_with_one_line_and_nothing_recorded(
    isolated_user: Path, hub_on: None
) -> None:
    from typer.testing import CliRunner

    import ckpteval
    from ckpteval.cli.main import app

    for dry_run in ([], ["--dry-run"]):  # the dry run refuses what the run would
        result = CliRunner().invoke(
            app, ["-c", "tiny", "-t", "piqa", "-t", "adlr_mmlu", "--limit", "2", *dry_run], terminal_width=200
        )
        assert result.exit_code == 2, result.output
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert lines[0].startswith("error: Task piqa cannot run here: its datasets (baber/piqa)"), result.output
        assert "the hub does not answer" in lines[0] and "adlr_mmlu" not in lines[0]  # MMLU has packaged data
        assert "evaluate data fetch -t piqa" in lines[1] and len(lines) == 2
        assert "Traceback" not in result.output
        assert ckpteval.statuses() == []  # nothing recorded, no job started


def test_the_hub_is_asked_only_for_tasks_that_need_it_and_with_the_jobs_own_environment(
    isolated_user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub_on: None
) -> None:
    from ckpteval.errors import ConfigError
    from ckpteval.execution.pipeline import refuse_hubless
    from tests.support.hf_hub import HubStandIn

    refuse_hubless(compiled_for("adlr_mmlu", "hellaswag"))  # packaged data: the hub is not needed
    with pytest.raises(
        ConfigError, match=r"hellaswag cannot run here: its datasets \(Rowan/hellaswag"
    ):  # packaged data switched off
        refuse_hubless(compiled_for("hellaswag", overrides=("evaluation.offline_data=off",)))
    own_copy = compiled_for("piqa")  # a task given its own dataset_dir reads it there
    own_copy = dataclasses.replace(own_copy, tasks=[dataclasses.replace(own_copy.tasks[0], dataset_dir="/data")])
    refuse_hubless(own_copy)

    cache = Path(os.environ["CKPTEVAL_DATA_CACHE"])  # fetched: read from the cache with the hub off
    manifest = cache / manifest_rel(DatasetRef("baber/piqa"))
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"files": {}, "links": {}}))
    refuse_hubless(compiled_for("piqa"))
    with pytest.raises(
        ConfigError, match=r"adlr_arc_challenge_llama_25_shot cannot run here: its datasets \(allenai/ai2_arc"
    ) as refused:
        refuse_hubless(compiled_for("piqa", "adlr_arc_challenge_llama_25_shot"))
    assert "piqa" not in str(refused.value.message)

    hub = HubStandIn(tmp_path / "hub")  # a hub that answers (no repositories needed to answer)
    try:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        refuse_hubless(compiled_for("adlr_arc_challenge_llama_25_shot"))
        switched_off = ("+execution.env_vars.HF_HUB_OFFLINE=1",)  # the job's own environment turns it off
        with pytest.raises(ConfigError, match="the hub does not answer"):
            refuse_hubless(compiled_for("adlr_arc_challenge_llama_25_shot", overrides=switched_off))
    finally:
        hub.stop()
