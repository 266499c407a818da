"""Task params as the client receives them: null means the task's own default."""

from __future__ import annotations

from pathlib import Path

from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest


def _params(*overrides: str) -> dict:
    compiled = compile_config(CompileRequest(configs=("tiny",), tasks=("gsm8k",), overrides=overrides))
    [task] = compiled.tasks
    return task.evaluator_config["config"]["params"]


def test_a_megatron_deployment_gives_its_tokenizer(isolated_user: Path, tmp_path: Path):
    """The compiled config says the checkpoint's own; the clients' run config names the directory the builtin
    server publishes it in (the checkpoint may name its tokenizer only in its args: a SentencePiece model...)."""
    from ckpteval.job.build import Toolchain, build_plan

    extra = _params()["extra"]
    assert extra["tokenizer"] == "from-checkpoint"
    assert extra["tokenizer_backend"] == "huggingface"
    compiled = compile_config(CompileRequest(configs=("tiny",), tasks=("gsm8k",)))
    toolchain = Toolchain(python="python3", evaluator="nemo-evaluator")
    plan = build_plan(compiled, invocation="i", job_dir=str(tmp_path), toolchain=toolchain, launcher="processes")
    [run] = plan.tasks[0].runs
    assert run.run_config["config"]["params"]["extra"]["tokenizer"] == str(tmp_path / "tokenizer")
    # lm-eval sends the token ids it counted: a server that tokenized text again (adding a BOS, or splitting
    # a cut context's first word otherwise) would shift the positions lm-eval reads its scores from
    assert run.run_config["config"]["params"]["extra"]["tokenized_requests"] is True
    assert (
        "--publish-tokenizer" in plan.deployment.step.command
        and str(tmp_path / "tokenizer") in plan.deployment.step.command
    )
    named = compile_config(
        CompileRequest(configs=("tiny",), tasks=("gsm8k",), overrides=("deployment.tokenizer=/tok",))
    )
    plan = build_plan(named, invocation="i", job_dir=str(tmp_path), toolchain=toolchain, launcher="processes")
    assert plan.tasks[0].runs[0].run_config["config"]["params"]["extra"]["tokenizer"] == "/tok"
    assert "--tokenizer /tok" in plan.deployment.step.command


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
