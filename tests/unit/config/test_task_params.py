"""Task params as the client receives them: null means the task's own default."""

from __future__ import annotations

from pathlib import Path

from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest


def _params(*overrides: str) -> dict:
    compiled = compile_config(CompileRequest(configs=("tiny",), tasks=("gsm8k",), overrides=overrides))
    [task] = compiled.tasks
    return task.evaluator_config["config"]["params"]


def test_a_megatron_deployment_gives_its_tokenizer(isolated_user: Path):
    extra = _params()["extra"]
    assert extra["tokenizer"].endswith("/tokenizer")
    assert extra["tokenizer_backend"] == "huggingface"


def test_no_tokenizer_leaves_the_backend_to_the_task(isolated_user: Path):
    """deployment none without a tokenizer: lm-eval would otherwise load one named after the served model
    from the hub (unreachable offline), so neither tokenizer nor backend is passed."""
    extra = _params("deployment=none", "target.api_endpoint.url=http://127.0.0.1:9/v1/completions")["extra"]
    assert "tokenizer" not in extra and "tokenizer_backend" not in extra


def test_an_explicit_tokenizer_keeps_the_backend(isolated_user: Path):
    extra = _params(
        "deployment=none", "target.api_endpoint.url=http://127.0.0.1:9/v1/completions", "deployment.tokenizer=/tok"
    )["extra"]
    assert (extra["tokenizer"], extra["tokenizer_backend"]) == ("/tok", "huggingface")


def test_vllm_takes_the_tokenizer_from_the_served_checkpoint(isolated_user: Path):
    from ckpteval.config.compose import compose

    def tokenizer(*overrides: str) -> str:
        return compose(CompileRequest(overrides=("deployment=vllm", *overrides))).data["deployment"]["tokenizer"]

    assert tokenizer("run.model=/ckpts/hf-model") == "/ckpts/hf-model"
    assert tokenizer("run.model=/x", "deployment.hf_model_handle=org/model") == "org/model"
