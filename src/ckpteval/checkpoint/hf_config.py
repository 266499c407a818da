"""What a Hugging Face `config.json` says about a model's forward pass, under Megatron-LM's setting names.

transformers 4 and 5 write the same model differently: 4 puts `rope_theta` and `rope_scaling` at the top level,
5 (the version ckpteval pins) one `rope_parameters` dict (`rope_theta`, `rope_type`, the type's factors,
sometimes `partial_rotary_factor`). Some settings have no key at all and are fixed by the model type (Qwen2's
attention always has a QKV bias, Qwen3's always norms queries and keys: `_FIXED_BY_TYPE`). `origin_settings`
reads every one of these into one mapping, setting -> `Said(key, value)`, holding only what the file (or its
model type) says: a setting it does not say is absent, never a default. stdlib only: it runs in the dry run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Megatron-LM's llama3 RoPE scaling takes one arg (rope_scaling_factor); megatron-core fixes the others
MEGATRON_LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
ROPE_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

# What a model type's transformers implementation fixes where its config.json has no key (keys win)
_LLAMA_LIKE = {
    "rotary_percent": 1.0,
    "normalization": "RMSNorm",
    "apply_layernorm_1p": False,
    "qk_norm": "none",
    "qkv_bias": False,
    "add_bias_linear": False,
    "window_size": "none",
}
_SOFTMAX_ROUTER = {"moe_router_score_function": "softmax"}
_FIXED_BY_TYPE: dict[str, dict[str, Any]] = {
    "llama": {**_LLAMA_LIKE},
    "mistral": {**_LLAMA_LIKE},
    "mixtral": {**_LLAMA_LIKE, **_SOFTMAX_ROUTER, "moe_topk_renormalized": True,
                "moe_shared_expert_intermediate_size": "none"},
    "qwen2": {**_LLAMA_LIKE, "qkv_bias": True},  # Qwen2Attention: bias on q, k and v, none on o
    "qwen2_moe": {**_LLAMA_LIKE, **_SOFTMAX_ROUTER, "qkv_bias": True},
    "qwen3": {**_LLAMA_LIKE, "qk_norm": "learned"},  # Qwen3Attention: RMSNorm per head on q and k
    "qwen3_moe": {**_LLAMA_LIKE, **_SOFTMAX_ROUTER, "qk_norm": "learned",
                  "moe_shared_expert_intermediate_size": "none"},
    "olmo2": {**_LLAMA_LIKE, "qk_norm": "learned"},
    "llama4_text": {**_LLAMA_LIKE},
    "gemma": {**_LLAMA_LIKE, "apply_layernorm_1p": True},  # Gemma's RMSNorm multiplies by 1 + w
    "gemma2": {**_LLAMA_LIKE, "apply_layernorm_1p": True},
    "gemma3_text": {**_LLAMA_LIKE, "apply_layernorm_1p": True, "qk_norm": "learned"},
    "nemotron": {"normalization": "LayerNorm", "apply_layernorm_1p": True, "qk_norm": "none", "window_size": "none"},
    "gpt2": {"normalization": "LayerNorm", "apply_layernorm_1p": False, "qk_norm": "none", "qkv_bias": True,
             "add_bias_linear": True, "window_size": "none", "position_embedding_type": "learned_absolute"},
}  # fmt: skip
_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "relu2": "relu2",
    "gelu": "gelu",
    "gelu_new": "gelu-tanh",
    "gelu_pytorch_tanh": "gelu-tanh",
    "gelu_fast": "gelu-tanh",
    "quick_gelu": "quick-gelu",
    "relu": "relu",
}


@dataclass(frozen=True)
class Said:
    """What config.json says about one setting: the key (or `model_type=...` where the model type fixes it)
    and the value, in Megatron-LM's terms."""

    key: str
    value: Any


def origin_settings(config: dict[str, Any]) -> tuple[dict[str, Said], dict[str, str]]:
    """(setting -> what config.json says, setting -> why it cannot be read) of a Hugging Face config.json, a
    multimodal model's language model (`text_config`) where it has one. Settings are Megatron-LM's names plus
    `activation`, `qk_norm`, `qkv_bias`, `rope_type` and `rope_scaling.<field>` (see `checkpoint.origin`)."""
    config = config.get("text_config") or config
    kind = str(config.get("model_type") or "")
    said: dict[str, Said] = {}
    unreadable: dict[str, str] = {}

    def first(setting: str, *keys: str) -> None:
        key = next((k for k in keys if config.get(k) is not None), None)
        if key is not None:
            said[setting] = Said(key, config[key])

    first("num_layers", "num_hidden_layers", "n_layer", "num_layers")
    first("hidden_size", "hidden_size", "n_embd")
    first("ffn_hidden_size", "intermediate_size", "n_inner", "ffn_hidden_size")
    if kind == "llama4_text":  # its dense MLP is intermediate_size_mlp wide (intermediate_size: the experts')
        first("ffn_hidden_size", "intermediate_size_mlp")
    first("num_attention_heads", "num_attention_heads", "n_head")
    first("num_query_groups", "num_key_value_heads")
    first("kv_channels", "head_dim")
    first("padded_vocab_size", "vocab_size")
    first("norm_epsilon", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "norm_epsilon")
    first("tied_embeddings", "tie_word_embeddings")
    _rope(config, said, unreadable)
    _activation(config, said, unreadable)
    _normalization(config, said)
    _attention(config, kind, said, unreadable)
    _moe(config, kind, said)
    for setting, value in _FIXED_BY_TYPE.get(kind, {}).items():
        said.setdefault(setting, Said(f"model_type={kind}", value))
    return said, unreadable


def _rope(config: dict[str, Any], said: dict[str, Said], unreadable: dict[str, str]) -> None:
    params = config.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        if len(params) != 1:  # one per layer type (Gemma-3): Megatron-LM has one RoPE
            why = f"rope_parameters has one per layer type ({', '.join(params)})"
            for setting in ("rotary_base", "rope_type"):
                unreadable[setting] = why
            return
        params = next(iter(params.values()))
    scaling: Any
    if isinstance(params, dict):  # transformers 5
        where, scaling = "rope_parameters", params
        if params.get("rope_theta") is not None:
            said["rotary_base"] = Said("rope_parameters.rope_theta", params["rope_theta"])
        if params.get("partial_rotary_factor") is not None:
            said["rotary_percent"] = Said("rope_parameters.partial_rotary_factor", params["partial_rotary_factor"])
    else:  # transformers 4: `rope_scaling: null` means none; no rope_scaling key says nothing
        where, scaling = "rope_scaling", config.get("rope_scaling")
        if config.get("rope_theta") is not None:
            said["rotary_base"] = Said("rope_theta", config["rope_theta"])
        if scaling is None and "rope_scaling" in config:
            scaling = {"rope_type": "default"}
    if "rotary_percent" not in said and config.get("partial_rotary_factor") is not None:
        said["rotary_percent"] = Said("partial_rotary_factor", config["partial_rotary_factor"])
    if "rotary_base" in said or isinstance(params, dict):
        said["position_embedding_type"] = Said(where if "rotary_base" not in said else said["rotary_base"].key, "rope")
    if not isinstance(scaling, dict):
        return
    rope_type = scaling.get("rope_type") or scaling.get("type")
    if rope_type is None:
        unreadable["rope_type"] = f"{where} names no rope_type"
        return
    said["rope_type"] = Said(f"{where}.{'rope_type' if 'rope_type' in scaling else 'type'}", str(rope_type))
    for field in ROPE_FIELDS:
        if rope_type != "default" and scaling.get(field) is not None:
            said[f"rope_scaling.{field}"] = Said(f"{where}.{field}", scaling[field])


def _activation(config: dict[str, Any], said: dict[str, Said], unreadable: dict[str, str]) -> None:
    key = next((k for k in ("hidden_act", "hidden_activation", "activation_function") if config.get(k)), None)
    if key is None:
        return
    name = str(config[key])
    if name in _ACTIVATIONS:
        said["activation"] = Said(key, _ACTIVATIONS[name])
    else:
        unreadable["activation"] = f"{key}={name} is not one ckpteval knows"


def _normalization(config: dict[str, Any], said: dict[str, Said]) -> None:
    if config.get("rms_norm_eps") is not None:
        said["normalization"] = Said("rms_norm_eps", "RMSNorm")
    elif config.get("layer_norm_eps") is not None or config.get("layer_norm_epsilon") is not None:
        key = "layer_norm_eps" if config.get("layer_norm_eps") is not None else "layer_norm_epsilon"
        said["normalization"] = Said(key, "LayerNorm")


def _attention(config: dict[str, Any], kind: str, said: dict[str, Said], unreadable: dict[str, str]) -> None:
    if kind == "llama4_text" and config.get("use_qk_norm") is not None:
        said["qk_norm"] = Said("use_qk_norm", "l2" if config["use_qk_norm"] else "none")
    elif config.get("qk_layernorm") is not None:
        said["qk_norm"] = Said("qk_layernorm", "learned" if config["qk_layernorm"] else "none")
    key = next((k for k in ("qkv_bias", "attention_bias") if config.get(k) is not None), None)
    if key is not None:
        said["qkv_bias"] = Said(key, bool(config[key]))
    if config.get("mlp_bias") is not None:
        said["add_bias_linear"] = Said("mlp_bias", bool(config["mlp_bias"]))
    window, key = config.get("sliding_window"), "sliding_window"
    if config.get("use_sliding_window") is False:
        window, key = None, "use_sliding_window"
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and window:
        windowed = tuple(t == "sliding_attention" for t in layer_types)
        if any(windowed):
            said["window_layers"] = Said("layer_types", windowed)
        else:
            window, key = None, "layer_types"
    elif window and isinstance(config.get("num_hidden_layers"), int):  # every layer (Mistral)
        said["window_layers"] = Said("sliding_window", (True,) * config["num_hidden_layers"])
    if "sliding_window" in config or "use_sliding_window" in config:
        said["window_size"] = Said(key, int(window) if window else "none")
    if config.get("attention_chunk_size"):
        unreadable["attention_chunk_size"] = "Megatron-LM's args have no chunked attention"


def _moe(config: dict[str, Any], kind: str, said: dict[str, Said]) -> None:
    def first(setting: str, *keys: str) -> None:
        key = next((k for k in keys if config.get(k) is not None), None)
        if key is not None:
            said[setting] = Said(key, config[key])

    first("num_experts", "num_local_experts", "num_experts", "n_routed_experts")
    first("moe_router_topk", "num_experts_per_tok")
    first("moe_ffn_hidden_size", "moe_intermediate_size")
    first("moe_shared_expert_intermediate_size", "shared_expert_intermediate_size")
    if "moe_shared_expert_intermediate_size" not in said and config.get("n_shared_experts") is not None:
        width = int(config["n_shared_experts"]) * int(config.get("moe_intermediate_size") or 0)
        said["moe_shared_expert_intermediate_size"] = Said("n_shared_experts x moe_intermediate_size", width or "none")
    if kind == "mixtral":  # its experts are intermediate_size wide; it has no dense MLP
        first("moe_ffn_hidden_size", "intermediate_size")
    if config.get("norm_topk_prob") is not None:
        said["moe_topk_renormalized"] = Said("norm_topk_prob", bool(config["norm_topk_prob"]))
    if config.get("scoring_func") is not None:
        said["moe_router_score_function"] = Said("scoring_func", config["scoring_func"])
