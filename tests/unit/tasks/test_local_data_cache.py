"""A local run reads the dataset cache (`evaluate data fetch`) for a task whose datasets are all in it."""

from __future__ import annotations

import json
import logging
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


def test_with_the_hub_off_a_task_with_no_data_here_is_flagged_when_planned(
    isolated_user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with caplog.at_level(logging.WARNING, logger="ckpteval.notice"):
        env = plan_env(tmp_path, "piqa", "adlr_mmlu")
    flagged = [r.getMessage() for r in caplog.records]
    assert len(flagged) == 1 and flagged[0].startswith("Task piqa has no packaged data and its dataset baber/piqa")
    assert "evaluate data fetch -t piqa" in flagged[0]
    assert "HF_HOME" not in env["piqa"]
