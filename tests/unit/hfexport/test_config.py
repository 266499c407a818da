"""Which Hugging Face family an architecture is written as, and its config.json (no torch, no weights)."""

from __future__ import annotations

import dataclasses

import pytest

from ckpteval.checkpoint.architecture import ModelArchitecture
from ckpteval.checkpoint.hf_export_config import generation_config, hf_config, hf_family, legacy_view
from ckpteval.errors import DeploymentError
from ckpteval.server.packaged import TINY_ARCHITECTURE

LLAMA = dataclasses.replace(TINY_ARCHITECTURE, rotary_base=500000.0)


def _config(arch: ModelArchitecture, vocab: int = 257) -> dict:
    return hf_config(arch, hf_family(arch), vocab_size=vocab, dtype="bfloat16", bos_token_id=None, eos_token_id=256)


@pytest.mark.parametrize(
    ("changes", "family"),
    [
        ({}, "llama"),
        ({"add_qkv_bias": True, "untie_embeddings_and_output_weights": False}, "qwen2"),
        ({"qk_layernorm": True}, "qwen3"),
        ({"window_size": (4095, 0)}, "mistral"),
        ({"num_experts": 8, "moe_ffn_hidden_size": 32, "moe_router_topk": 2}, "mixtral"),
        ({"num_experts": 8, "moe_ffn_hidden_size": 32, "qk_layernorm": True, "moe_router_pre_softmax": True},
         "qwen3_moe"),
        ({"num_experts": 8, "moe_ffn_hidden_size": 32, "add_qkv_bias": True, "moe_shared_expert_intermediate_size": 64,
          "moe_shared_expert_gate": True}, "qwen2_moe"),
        ({"rotary_interleaved": True}, "llama4_text"),
        ({"rotary_interleaved": True, "qk_l2_norm": True}, "llama4_text"),
        ({"rotary_interleaved": True, "no_rope_freq": 2}, "llama4_text"),
        ({"normalization": "LayerNorm", "apply_layernorm_1p": True, "swiglu": False, "squared_relu": True,
          "rotary_percent": 0.5}, "nemotron"),
    ],
)  # fmt: skip
def test_each_architecture_is_written_as_its_family(changes: dict, family: str) -> None:
    arch = dataclasses.replace(LLAMA, **changes)
    assert hf_family(arch).model_type == family
    config = _config(arch)
    assert config["model_type"] == family and config["architectures"] == [hf_family(arch).architecture]


def test_config_is_true_to_the_args() -> None:
    arch = dataclasses.replace(LLAMA, use_rope_scaling=True, rope_scaling_factor=32.0, padded_vocab_size=384)
    config = _config(arch, vocab=257)
    assert config["vocab_size"] == 257  # unpadded: the tokenizer's rows, not Megatron's 384
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (2, 64, 192)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 16)
    assert config["rope_theta"] == 500000.0 and config["tie_word_embeddings"] is False
    assert config["rope_scaling"] == {
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }  # fmt: skip
    assert config["rope_parameters"] == {"rope_theta": 500000.0, **config["rope_scaling"]}  # transformers 5's form
    assert config["dtype"] == config["torch_dtype"] == "bfloat16" and config["eos_token_id"] == 256

    mistral = _config(dataclasses.replace(LLAMA, window_size=(4095, 0)))
    assert mistral["sliding_window"] == 4096  # HF's window counts the token itself
    moe = _config(dataclasses.replace(LLAMA, num_experts=8, moe_ffn_hidden_size=32, qk_layernorm=True))
    assert (moe["num_experts"], moe["moe_intermediate_size"], moe["num_experts_per_tok"]) == (8, 32, 2)
    assert moe["norm_topk_prob"] is True  # megatron's top-k then softmax: renormalised


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"qk_l2_norm": True}, "rotary_interleaved=False"),
        ({"no_rope_freq": (0, 1)}, "rotary_interleaved=False"),
        # megatron-core norms every layer's queries and keys, Llama-4 only its RoPE layers'
        ({"rotary_interleaved": True, "qk_l2_norm": True, "no_rope_freq": (0, 1)}, "qk_l2_norm=True with no_rope"),
        ({"rotary_interleaved": True, "num_experts": 4, "moe_ffn_hidden_size": 32}, "mixture of experts"),
        ({"rotary_interleaved": True, "add_qkv_bias": True}, "a bias"),
        ({"position_embedding_type": "learned_absolute"}, "position_embedding_type"),
        ({"num_experts": 4, "moe_ffn_hidden_size": 32, "moe_router_score_function": "sigmoid"},
         "moe_router_score_function"),
        ({"rotary_percent": 0.5}, "rotary_percent"),
    ],
)  # fmt: skip
def test_what_no_family_computes_is_refused_by_name(changes: dict, named: str) -> None:
    with pytest.raises(DeploymentError, match=named):
        hf_family(dataclasses.replace(LLAMA, **changes))


def test_a_transformers_5_config_is_read_with_its_rope_theta() -> None:
    view = legacy_view({"rope_parameters": {"rope_theta": 1e6, "rope_type": "linear", "factor": 2.0}})
    assert view["rope_theta"] == 1e6 and view["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}


def test_llama4_config_says_what_megatron_computes_to_transformers_and_to_vllm() -> None:
    arch = dataclasses.replace(LLAMA, rotary_interleaved=True, no_rope_freq=2, max_position_embeddings=4096)
    config = _config(arch)
    assert config["no_rope_layers"] == [1, 0]  # every 2nd layer without RoPE; 1: the layer rotates
    assert config["use_qk_norm"] is False and config["intermediate_size_mlp"] == 192
    # dense: transformers reads moe_layers, vLLM interleave_moe_layer_step
    assert config["moe_layers"] == [] and config["interleave_moe_layer_step"] == 0
    # no chunk boundary inside the context, and no query rescaling on the NoPE layers
    assert config["attention_chunk_size"] == 4096 and config["attn_temperature_tuning"] is False
    # vLLM turns the rescaling on past 32k tokens unless generation_config.json says otherwise
    generation = generation_config(hf_family(arch), bos_token_id=None, eos_token_id=2, pad_token_id=None)
    assert generation["attn_temperature_tuning"] is False
    assert "attn_temperature_tuning" not in generation_config(
        hf_family(LLAMA), bos_token_id=None, eos_token_id=2, pad_token_id=None
    )
