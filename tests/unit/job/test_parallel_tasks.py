"""How many task clients run at once: from evaluation.max_parallel_tasks through the compiled config to the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.errors import ConfigError
from ckpteval.job.build import Toolchain, build_plan
from ckpteval.job.plan import MAX_PARALLEL_TASKS, parallel_tasks


def test_default_is_every_task_up_to_the_bound() -> None:
    assert parallel_tasks(None, 3) == 3
    assert parallel_tasks(None, 20) == MAX_PARALLEL_TASKS == 8
    assert parallel_tasks(1, 3) == 1 and parallel_tasks(5, 2) == 2


def _plan(tmp_path: Path, *overrides: str):
    request = CompileRequest(configs=("tiny",), tasks=("adlr_mmlu", "hellaswag", "gsm8k"), overrides=overrides)
    compiled = compile_config(request)
    toolchain = Toolchain(python="python3", evaluator="nemo-evaluator")
    return build_plan(compiled, invocation="i", job_dir=str(tmp_path), toolchain=toolchain, launcher="processes")


def test_the_config_sets_it(isolated_user: Path, tmp_path: Path) -> None:
    assert _plan(tmp_path).max_parallel_tasks == 3
    assert _plan(tmp_path, "evaluation.max_parallel_tasks=1").max_parallel_tasks == 1


def test_less_than_one_is_a_config_error(isolated_user: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_parallel_tasks must be at least 1"):
        _plan(tmp_path, "evaluation.max_parallel_tasks=0")


def test_clients_prepare_during_the_load_unless_told_not_to(isolated_user: Path, tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    assert plan.prepare_during_load is True
    assert _plan(tmp_path, "evaluation.prepare_during_load=false").prepare_during_load is False
    # -c tiny's deployment prepares its checkpoint in the job, and the builtin server publishes the tokenizer
    # it serves with in the job directory: the clients, which read that tokenizer, wait for both
    checkpoint, tokenizer = _plan(tmp_path, "deployment.prepare=smollm2").clients_need
    assert checkpoint.endswith("smollm2") and tokenizer == str(tmp_path / "tokenizer")
    mine = _plan(tmp_path, "deployment.prepare=null", f"run.model={tmp_path}")
    assert mine.clients_need == (str(tmp_path / "tokenizer"),)
