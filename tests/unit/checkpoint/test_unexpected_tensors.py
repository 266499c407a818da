"""Tensors the args do not describe: Qwen-style checkpoints written by megatron-core (the test corpus: Qwen3 with
per-head query/key norms, Qwen2 with a QKV bias) whose args lost `qk_layernorm` and `add_qkv_bias` are refused
before the job (from the tensor index, in the dry run and `inspect`) and by the server when it loads (exactly,
naming the tensors and the arg), unless `deployment.ignore_unexpected_tensors=true`; served anyway, such a
checkpoint computes another model than the one saved."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.checkpoint.description import describe_checkpoint
from ckpteval.cli.main import app
from ckpteval.errors import DeploymentError
from tests.support.corpus import built_once
from tests.support.corpus.architectures import NAMES, build_many
from tests.support.corpus.edit import with_args

runner = CliRunner()


@pytest.fixture(scope="module")
def lost(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The corpus's Qwen3 and Qwen2 checkpoints (the parity tests' own, built once a session) and copies whose
    args lost qk_layernorm and add_qkv_bias."""
    corpus = built_once(tmp_path_factory, "architectures", lambda root: build_many({n: root / n for n in NAMES}))
    base = tmp_path_factory.mktemp("lost-args")
    return {
        "qwen3": corpus["qwen3"],
        "qwen2": corpus["qwen2"],
        "qwen3-lost": with_args(corpus["qwen3"], base / "qwen3-lost", qk_layernorm=False),
        "qwen2-lost": with_args(corpus["qwen2"], base / "qwen2-lost", add_qkv_bias=False),
    }


QK_NORMS = "decoder.layers.self_attention.k_layernorm.weight, decoder.layers.self_attention.q_layernorm.weight"
QKV_BIAS = "decoder.layers.self_attention.linear_qkv.bias"


def test_the_tensor_index_names_them_before_the_job(lost: dict[str, Path]) -> None:
    assert describe_checkpoint(lost["qwen3"]).unexpected_tensors == ()
    assert describe_checkpoint(lost["qwen2"]).unexpected_tensors == ()
    qwen3 = [str(g) for g in describe_checkpoint(lost["qwen3-lost"]).unexpected_tensors]
    assert qwen3 == [f"{QK_NORMS} (built with qk_layernorm=True, which the args lack)"]
    qwen2 = [str(g) for g in describe_checkpoint(lost["qwen2-lost"]).unexpected_tensors]
    assert qwen2 == [f"{QKV_BIAS} (built with add_qkv_bias=True, which the args lack)"]


def _dry_run(checkpoint: Path, *overrides: str) -> tuple[int, str]:
    result = runner.invoke(
        app,
        ["-c", "tiny", "-t", "gsm8k", "deployment.prepare=null", f"run.model={checkpoint}", *overrides, "--dry-run"],
    )
    return result.exit_code, " ".join(result.output.split())


def test_the_run_is_refused_unless_allowed_and_inspect_shows_them(
    lost: dict[str, Path], isolated_user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    code, out = _dry_run(lost["qwen3-lost"])
    assert code == 1 and "Traceback" not in out, out
    assert "holds 2 tensor(s) that the model its args build does not have" in out and QK_NORMS in out
    assert "Set qk_layernorm=True in the checkpoint's args" in out
    assert "deployment.ignore_unexpected_tensors=true" in out
    code, out = _dry_run(lost["qwen3-lost"], "deployment.ignore_unexpected_tensors=true")
    assert code == 0, out
    assert "--ignore-unexpected-tensors" in out  # the job's server is told too
    shown = runner.invoke(app, ["inspect", str(lost["qwen2-lost"])])
    assert shown.exit_code == 0 and f"unexpected {QKV_BIAS}" in " ".join(shown.output.split())


def test_the_server_refuses_them_when_it_loads_unless_allowed(lost: dict[str, Path]) -> None:
    """The server is the last line (a tensor the index check does not know, Export-Deploy aside): it compares
    every tensor of the checkpoint with the model built. Allowed, the checkpoint loads and computes another
    model than the one saved."""
    import torch

    from ckpteval.server.serve import load_model

    with pytest.raises(DeploymentError) as refused:
        load_model(lost["qwen3-lost"], device="cpu", dtype="float32")
    assert QK_NORMS in refused.value.message and "qk_layernorm=True" in refused.value.message
    assert "--ignore-unexpected-tensors" in (refused.value.hint or "")
    with pytest.raises(DeploymentError, match="built with add_qkv_bias=True"):
        load_model(lost["qwen2-lost"], device="cpu", dtype="float32")

    ids = list(b"Norms on queries and keys")
    scores = {}
    for name, ignore in (("qwen3", False), ("qwen3-lost", True)):
        loaded = load_model(lost[name], device="cpu", dtype="float32", ignore_unexpected_tensors=ignore)
        scores[name] = torch.tensor(loaded.runner.score([ids], top_k=1)[0].token_logprobs)
    assert float((scores["qwen3"] - scores["qwen3-lost"]).abs().max()) > 1e-2
