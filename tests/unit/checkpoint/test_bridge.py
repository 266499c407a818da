"""Megatron-Bridge checkpoints: found, translated into Megatron-LM args, served like the Megatron-LM save
of the same weights, and read back as the same model by Megatron-Bridge 0.3.1's own loaders."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckpteval.checkpoint.architecture import ModelArchitecture
from ckpteval.checkpoint.bridge import bridge_args, hf_model_id, is_bridge_checkpoint
from ckpteval.checkpoint.layout import MEGATRON_BRIDGE, MEGATRON_LM, locate_checkpoint
from ckpteval.errors import DeploymentError
from tests.support.corpus.bridge import (
    BRIDGE_LLAMA,
    HF_MODEL_ID,
    ITERATION,
    RELEASES,
    TEMPLATE,
    build_bridge_llama,
    to_release,
)

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny Llama in Bridge 0.3.1's layout and, with the same weights, in Megatron-LM's."""
    base = tmp_path_factory.mktemp("bridge")
    return build_bridge_llama(base / "bridge", "0.3.1", megatron_lm_twin=base / "megatron-lm"), base / "megatron-lm"


@pytest.fixture(scope="module", params=RELEASES)
def release_checkpoint(request: pytest.FixtureRequest, saved: tuple[Path, Path], tmp_path_factory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp("release") / "ckpt"
    shutil.copytree(saved[0], root)
    return request.param, to_release(root, request.param)


def test_each_release_is_found_from_its_trackers(release_checkpoint: tuple[str, Path]) -> None:
    release, root = release_checkpoint
    assert (root / "latest_checkpointed_iteration.txt").exists() == (release != "0.1.0rc4")
    layout = locate_checkpoint(root)
    assert (layout.kind, layout.iteration, layout.iter_dir.name) == (MEGATRON_BRIDGE, ITERATION, "iter_0000010")
    assert is_bridge_checkpoint(layout.iter_dir)
    copied = release == "0.3.1"
    assert (layout.tokenizer_dir == layout.iter_dir / "tokenizer") == copied
    assert (layout.tokenizer_dir is None) == (not copied)
    assert hf_model_id(root) == (HF_MODEL_ID if copied else None)
    assert hf_model_id(layout.iter_dir) == hf_model_id(root)


def test_the_iteration_directory_is_found_too(saved: tuple[Path, Path]) -> None:
    layout = locate_checkpoint(saved[0] / "iter_0000010")
    assert (layout.kind, layout.iteration, layout.root) == (MEGATRON_BRIDGE, ITERATION, saved[0].resolve())
    assert locate_checkpoint(saved[1]).kind == MEGATRON_LM


def test_a_bridge_root_without_any_tracker_names_both(saved: tuple[Path, Path], tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(saved[0], root)
    (root / "latest_checkpointed_iteration.txt").unlink()
    (root / "latest_train_state.pt").unlink()
    with pytest.raises(DeploymentError, match=r"latest_train_state\.pt") as info:
        locate_checkpoint(root)
    assert "iter_0000010" in str(info.value.hint)


def test_the_bridge_args_describe_the_saved_model(saved: tuple[Path, Path]) -> None:
    from ckpteval.server.checkpoint import load_checkpoint_info

    bridge, megatron_lm = load_checkpoint_info(saved[0]), load_checkpoint_info(saved[1])
    assert bridge.architecture == BRIDGE_LLAMA == megatron_lm.architecture
    assert bridge.tokenizer_dir == bridge.iter_dir / "tokenizer"
    args = bridge.args
    assert (args.vocab_size, args.padded_vocab_size, args.make_vocab_size_divisible_by) == (257, 384, 128)
    assert (args.tokenizer_type, args.tokenizer_model) == ("HuggingFaceTokenizer", str(bridge.iter_dir / "tokenizer"))
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (1, 1)
    assert args.bridge_provider == "megatron.bridge.models.gpt_provider.GPTModelProvider"


def test_served_log_probs_equal_the_megatron_lm_save(saved: tuple[Path, Path]) -> None:
    from ckpteval.server.serve import load_model

    bridge, megatron_lm = (load_model(path, device="cpu") for path in saved)
    ids = bridge.runner.tokenizer.encode("Megatron-Bridge and Megatron-LM, one model.")
    assert ids == megatron_lm.runner.tokenizer.encode("Megatron-Bridge and Megatron-LM, one model.")
    got = bridge.runner.score([ids], top_k=3)[0]
    want = megatron_lm.runner.score([ids], top_k=3)[0]
    assert got.token_logprobs == want.token_logprobs
    assert len(set(got.token_logprobs[1:])) > 3  # a model whose predictions vary, not a constant


def test_bridge_031_reads_what_we_write(saved: tuple[Path, Path], tmp_path: Path) -> None:
    """Megatron-Bridge 0.3.1's read_run_config, load_model_config, load_tokenizer and build_and_load_model."""
    import torch

    from tests.support.megatron_bridge import bridge_source

    source = bridge_source()
    if isinstance(source, str):
        pytest.skip(source)
    out = tmp_path / "seen.pt"
    iter_dir = saved[0] / "iter_0000010"
    # Bridge makes its own one-rank world: not on the rendezvous port this process's world holds
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.megatron_bridge", str(iter_dir), str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = torch.load(out, weights_only=False)
    fields = seen["fields"]
    args = bridge_args(iter_dir)
    for name, arg in (("num_layers", "num_layers"), ("hidden_size", "hidden_size"), ("kv_channels", "kv_channels")):
        assert fields[name] == getattr(args, arg)
    assert ModelArchitecture.from_args(args, where="test") == BRIDGE_LLAMA
    assert fields["num_query_groups"] == BRIDGE_LLAMA.num_query_groups
    assert fields["activation_func"] == "torch.nn.functional.silu" and fields["gated_linear_unit"]
    assert (fields["rotary_base"], fields["rope_scaling"], fields["rope_scaling_factor"]) == (500000, True, 8.0)
    assert fields["share_embeddings_and_output_weights"] and fields["params_dtype"] == "torch.bfloat16"
    assert seen["hf_model_id"] == HF_MODEL_ID
    assert seen["tokenizer_vocab_size"] == 257
    assert seen["tokenizer_ids"] == list("Grüße, Megatron!".encode())

    from ckpteval.server.serve import load_model

    ours = load_model(saved[1], device="cpu", dtype="bfloat16").runner.model.state_dict()
    theirs = seen["state_dict"]
    weights = {k for k, v in ours.items() if isinstance(v, torch.Tensor) and "_extra_state" not in k}
    assert weights <= set(theirs)
    for key in weights:
        assert torch.equal(ours[key], theirs[key].to(ours[key].dtype)), key


# ---- the translation of run_config.yaml sections other than the saved Llama's


def _args(tmp_path: Path, **model: Any) -> Any:
    config = yaml.safe_load(TEMPLATE.read_text())
    target = model.pop("_target_", None)
    config["model"].update(model)
    if target:
        config["model"]["_target_"] = target
    (tmp_path / "run_config.yaml").write_text(yaml.safe_dump(config))
    return bridge_args(tmp_path)


def test_nemotron4_fields_become_megatron_lm_args(tmp_path: Path) -> None:
    args = _args(
        tmp_path,
        _target_="megatron.bridge.models.nemotron.nemotron_provider.Nemotron4ModelProvider15B",
        activation_func={"_target_": "megatron.core.activations.squared_relu", "_call_": False},
        gated_linear_unit=False,
        normalization="LayerNorm",
        layernorm_zero_centered_gamma=True,
        rotary_percent=0.5,
        share_embeddings_and_output_weights=False,
    )
    assert (args.squared_relu, args.swiglu, args.apply_layernorm_1p) == (True, False, True)
    assert (args.rotary_percent, args.untie_embeddings_and_output_weights) == (0.5, True)


def test_moe_and_qwen_fields_keep_megatron_lm_names(tmp_path: Path) -> None:
    args = _args(
        tmp_path,
        _target_="megatron.bridge.models.qwen.qwen_provider.Qwen3MoEModelProvider30B_A3B",
        num_moe_experts=8,
        moe_router_topk=2,
        moe_ffn_hidden_size=32,
        moe_router_pre_softmax=True,
        qk_layernorm=True,
        add_qkv_bias=True,
        window_size=[128, 0],
        expert_model_parallel_size=2,
    )
    assert (args.num_experts, args.moe_router_topk, args.moe_ffn_hidden_size, args.moe_router_pre_softmax) == (
        8,
        2,
        32,
        True,
    )
    assert (args.qk_layernorm, args.add_qkv_bias, args.expert_model_parallel_size) == (True, True, 2)
    assert args.window_size == [128, 0]  # kept under its Megatron-LM name for the forward-args check
    assert not hasattr(args, "num_moe_experts")


def test_hybrid_mamba_is_refused_by_the_architecture(tmp_path: Path) -> None:
    args = _args(
        tmp_path,
        _target_="megatron.bridge.models.nemotronh.nemotron_h_provider.NemotronHModelProvider8B",
        hybrid_override_pattern="M-M*-",
    )
    assert args.hybrid_override_pattern == "M-M*-"
    with pytest.raises(DeploymentError, match="hybrid_override_pattern"):
        ModelArchitecture.from_args(args, where="test")


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ({"_target_": "megatron.bridge.models.gemma.gemma_provider.GemmaModelProvider2B"}, "GemmaModelProvider2B"),
        ({"_target_": "megatron.bridge.models.llama.llama_provider.Llama4Experts16ModelProvider"}, "Llama4"),
        (
            {"activation_func": {"_target_": "torch.nn.functional.gelu", "_call_": False}, "gated_linear_unit": True},
            "activation_func=torch.nn.functional.gelu",
        ),
        (
            {"transformer_layer_spec": {"_target_": "my.project.custom_spec", "_call_": False}},
            "my.project.custom_spec",
        ),
    ],
)
def test_what_megatron_lm_cannot_express_is_refused(tmp_path: Path, model: dict[str, Any], named: str) -> None:
    with pytest.raises(DeploymentError, match=named) as info:
        _args(tmp_path, **model)
    assert "export-deploy" in str(info.value.hint)


def test_file_tokenizers_point_at_the_checkpoints_copy(tmp_path: Path) -> None:
    config = yaml.safe_load(TEMPLATE.read_text())
    config["tokenizer"].update(
        tokenizer_type="GPT2BPETokenizer", vocab_file="/lustre/gpt2-vocab.json", merge_file="/lustre/merges.txt"
    )
    config["tokenizer"]["special_tokens"] = ["<extra_0>"]
    (tmp_path / "run_config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "vocab.json").write_text("{}")
    args = bridge_args(tmp_path)
    assert args.vocab_file == str(tmp_path / "tokenizer" / "vocab.json")
    assert args.merge_file == "/lustre/merges.txt"  # no copy of it: left as recorded
    assert args.tokenizer_special_tokens == ["<extra_0>"]


def test_a_run_config_without_a_model_section(tmp_path: Path) -> None:
    (tmp_path / "run_config.yaml").write_text("tokenizer: {}\n")
    with pytest.raises(DeploymentError, match="no `model:` section"):
        bridge_args(tmp_path)
