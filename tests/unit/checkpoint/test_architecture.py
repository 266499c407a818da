"""Reading a model's architecture from Megatron-LM's training args."""

from __future__ import annotations

import argparse

import pytest

from ckpteval.checkpoint.architecture import ModelArchitecture
from ckpteval.errors import DeploymentError


def megatron_lm_args(**overrides: object) -> argparse.Namespace:
    """The model-shaping subset of what Megatron-LM's validate_args leaves in `args` for a Llama-style run."""
    values: dict[str, object] = dict(
        num_layers=32,
        hidden_size=4096,
        ffn_hidden_size=14336,
        num_attention_heads=32,
        group_query_attention=True,
        num_query_groups=8,
        kv_channels=128,
        max_position_embeddings=8192,
        seq_length=8192,
        position_embedding_type="rope",
        rotary_base=500000,
        rotary_percent=1.0,
        use_rope_scaling=True,
        normalization="RMSNorm",
        norm_epsilon=1e-5,
        swiglu=True,
        add_bias_linear=False,
        add_qkv_bias=False,
        untie_embeddings_and_output_weights=True,
        padded_vocab_size=128256,
        bf16=True,
        num_experts=None,
        tokenizer_type="HuggingFaceTokenizer",
        tokenizer_model="meta-llama/Meta-Llama-3.1-8B",
    )
    values.update(overrides)
    return argparse.Namespace(**values)


def test_llama_style_args() -> None:
    arch = ModelArchitecture.from_args(megatron_lm_args(), where="ck")
    assert (arch.num_layers, arch.hidden_size, arch.ffn_hidden_size) == (32, 4096, 14336)
    assert arch.num_query_groups == 8 and arch.group_query_attention
    assert arch.swiglu and arch.normalization == "RMSNorm" and not arch.add_bias_linear
    assert arch.use_rope_scaling and arch.rotary_base == 500000
    assert arch.untie_embeddings_and_output_weights
    assert arch.params_dtype == "bfloat16"


def test_without_gqa_the_groups_equal_the_heads() -> None:
    arch = ModelArchitecture.from_args(megatron_lm_args(group_query_attention=False, num_query_groups=1), where="ck")
    assert arch.num_query_groups == arch.num_attention_heads == 32
    assert not arch.group_query_attention


def test_defaults_follow_megatron_lm() -> None:
    args = argparse.Namespace(
        num_layers=2, hidden_size=128, num_attention_heads=4, seq_length=512, disable_bias_linear=True
    )
    arch = ModelArchitecture.from_args(args, where="ck", vocab_from_weights=1024)
    assert arch.ffn_hidden_size == 512 and arch.kv_channels == 32
    assert arch.position_embedding_type == "learned_absolute"
    assert arch.max_position_embeddings == 512
    assert arch.padded_vocab_size == 1024
    assert arch.add_bias_linear is False  # from the older disable_bias_linear
    assert arch.params_dtype == "float32"


def test_to_args_round_trips() -> None:
    arch = ModelArchitecture.from_args(megatron_lm_args(), where="ck")
    args = arch.to_args(tokenizer_type="HuggingFaceTokenizer")
    assert args.group_query_attention is True and args.bf16 is True and args.ckpt_format == "torch_dist"
    assert ModelArchitecture.from_args(args, where="again") == arch


def test_missing_sizes_are_named() -> None:
    with pytest.raises(DeploymentError, match="do not say hidden_size, padded_vocab_size"):
        ModelArchitecture.from_args(argparse.Namespace(num_layers=2, num_attention_heads=4, seq_length=8), where="ck")


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ({"multi_latent_attention": True}, "multi-latent attention"),
        ({"hybrid_override_pattern": "M-M*"}, "hybrid Mamba"),
    ],
)
def test_unsupported_architectures_point_to_export_deploy(override: dict[str, object], fragment: str) -> None:
    with pytest.raises(DeploymentError) as info:
        ModelArchitecture.from_args(megatron_lm_args(**override), where="ck")
    assert fragment in info.value.message
    assert info.value.hint and "deployment.backend=export-deploy" in info.value.hint


def test_unsupported_position_embedding() -> None:
    with pytest.raises(DeploymentError, match="position_embedding_type='yarn' is not served"):
        ModelArchitecture.from_args(megatron_lm_args(position_embedding_type="yarn"), where="ck")
