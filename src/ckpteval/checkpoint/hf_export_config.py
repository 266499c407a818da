"""Which Hugging Face model family a Megatron architecture is, and the config.json that says so (stdlib only).

The family is the transformers (and vLLM) model class that computes exactly what megatron-core's GPT
computes for these settings; an architecture none of them computes is refused with the setting that rules
each out, never written as the nearest one. config.json carries the RoPE settings both ways transformers
has read them (`rope_theta` + `rope_scaling` before 5.0, `rope_parameters` since), so an engine pinned to
either reads the same model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ckpteval.checkpoint.architecture import ModelArchitecture
from ckpteval.errors import DeploymentError

# Megatron-core's Llama-3 RoPE scaling has these fixed (rotary_pos_embedding._apply_scaling's defaults)
LLAMA3_LOW_FREQ_FACTOR = 1.0
LLAMA3_HIGH_FREQ_FACTOR = 4.0
LLAMA3_ORIGINAL_MAX_POSITIONS = 8192


@dataclass(frozen=True)
class HfFamily:
    """A Hugging Face model family: its `model_type` and causal-LM class."""

    model_type: str
    architecture: str  # the transformers class vLLM and SGLang look up


FAMILIES = {
    "llama": HfFamily("llama", "LlamaForCausalLM"),
    "qwen2": HfFamily("qwen2", "Qwen2ForCausalLM"),
    "qwen3": HfFamily("qwen3", "Qwen3ForCausalLM"),
    "mistral": HfFamily("mistral", "MistralForCausalLM"),
    "mixtral": HfFamily("mixtral", "MixtralForCausalLM"),
    "qwen2_moe": HfFamily("qwen2_moe", "Qwen2MoeForCausalLM"),
    "qwen3_moe": HfFamily("qwen3_moe", "Qwen3MoeForCausalLM"),
    "nemotron": HfFamily("nemotron", "NemotronForCausalLM"),
    "llama4_text": HfFamily("llama4_text", "Llama4ForCausalLM"),
}


def _refuse(where: str, what: str) -> DeploymentError:
    return DeploymentError(
        f"{where} cannot be written as a Hugging Face model: {what}.",
        hint="Serve it with the builtin server (deployment.type=megatron) or Export-Deploy instead of vLLM/SGLang.",
    )


def hf_family(arch: ModelArchitecture, *, where: str = "the checkpoint") -> HfFamily:
    """The family that computes `arch`'s forward pass; DeploymentError naming the setting when none does."""
    a = arch
    unsupported = [
        ("position_embedding_type", a.position_embedding_type, a.position_embedding_type != "rope"),
        ("window_attn_skip_freq", a.window_attn_skip_freq, a.window_attn_skip_freq is not None),
        ("softmax_type", a.softmax_type, a.softmax_type != "vanilla"),
        ("quick_geglu", True, a.quick_geglu),
        ("glu_linear_offset", a.glu_linear_offset, a.glu_linear_offset != 0.0),
        ("activation_func_clamp_value", a.activation_func_clamp_value, a.activation_func_clamp_value is not None),
        ("softmax_scale", a.softmax_scale, a.softmax_scale is not None
         and not math.isclose(a.softmax_scale, a.kv_channels**-0.5, rel_tol=1e-6)),
    ]  # fmt: skip
    for name, value, present in unsupported:
        if present:
            raise _refuse(where, f"{name}={value!r} has no Hugging Face family this exporter writes")
    if a.apply_layernorm_1p or a.squared_relu:
        if not (a.normalization == "LayerNorm" and a.apply_layernorm_1p and a.squared_relu) or a.is_moe:
            raise _refuse(where, "layernorm-1p and squared ReLU come together only in Nemotron (dense, LayerNorm)")
        if a.add_qkv_bias or a.qk_layernorm or a.window_size is not None:
            raise _refuse(where, "Nemotron has no QKV-only bias, qk-layernorm or sliding window")
        return FAMILIES["nemotron"]
    if a.normalization != "RMSNorm" or not a.swiglu:
        raise _refuse(where, f"normalization={a.normalization}, swiglu={a.swiglu} (Llama-style families need "
                      "RMSNorm and SwiGLU; Nemotron needs layernorm-1p and squared ReLU)")  # fmt: skip
    if a.rotary_percent != 1.0:
        raise _refuse(where, f"rotary_percent={a.rotary_percent} (only Nemotron rotates part of each head)")
    if a.rotary_interleaved or a.qk_l2_norm or a.no_rope_freq is not None:
        return _llama4_family(a, where)
    if a.is_moe:
        return _moe_family(a, where)
    if a.qk_layernorm:
        if a.add_qkv_bias or a.add_bias_linear or a.window_size is not None:
            raise _refuse(where, "qk-layernorm (Qwen3) with a bias or a sliding window")
        return FAMILIES["qwen3"]
    if a.add_qkv_bias:
        if a.add_bias_linear or a.window_size is not None:
            raise _refuse(where, "a QKV bias (Qwen2) with other linear biases or a sliding window")
        return FAMILIES["qwen2"]
    if a.window_size is not None:
        if a.add_bias_linear:
            raise _refuse(where, "a sliding window (Mistral) with linear biases")
        return FAMILIES["mistral"]
    return FAMILIES["llama"]


def nope_layers(a: ModelArchitecture) -> tuple[bool, ...]:
    """Per layer, whether it skips RoPE (megatron-core's `no_rope_freq`: every Nth layer, or one 0/1 each)."""
    pattern = a.no_rope_freq
    if pattern is None:
        return (False,) * a.num_layers
    if isinstance(pattern, int):
        return tuple((n + 1) % pattern == 0 for n in range(a.num_layers))
    return tuple(bool(v) for v in pattern)


def _llama4_family(a: ModelArchitecture, where: str) -> HfFamily:
    """Llama-4's text model, the one family that rotates interleaved pairs (its RoPE is a complex product), norms
    queries and keys without a weight (`use_qk_norm`) and has layers without RoPE (`no_rope_layers`); dense only."""
    if not a.rotary_interleaved:
        raise _refuse(where, "qk_l2_norm or no_rope_freq with rotary_interleaved=False (Llama-4, the only family "
                      "with them, rotates interleaved pairs)")  # fmt: skip
    if a.is_moe:
        raise _refuse(where, "rotary_interleaved=True in a mixture of experts (Llama-4's experts: sigmoid top-1 "
                      "routing on the input, a shared expert) is not written by this exporter")  # fmt: skip
    if a.qk_layernorm or a.add_qkv_bias or a.add_bias_linear or a.window_size is not None:
        raise _refuse(where, "rotary_interleaved=True (Llama-4) with qk-layernorm, a bias or a sliding window")
    if a.qk_l2_norm and any(nope_layers(a)):
        raise _refuse(where, "qk_l2_norm=True with no_rope_freq: megatron-core norms the queries and keys of its "
                      "layers without RoPE too, Llama-4 only those of its RoPE layers")  # fmt: skip
    return FAMILIES["llama4_text"]


def _moe_family(a: ModelArchitecture, where: str) -> HfFamily:
    routing = [
        ("moe_router_score_function", a.moe_router_score_function, a.moe_router_score_function != "softmax"),
        ("moe_router_topk_scaling_factor", a.moe_router_topk_scaling_factor, a.moe_router_topk_scaling_factor
         not in (None, 1.0)),
        ("moe_router_enable_expert_bias", True, a.moe_router_enable_expert_bias),
        ("moe_router_num_groups", a.moe_router_num_groups, a.moe_router_num_groups is not None),
        ("moe_layer_freq", a.moe_layer_freq, a.moe_layer_freq != 1),
        ("moe_apply_probs_on_input", True, a.moe_apply_probs_on_input),
        ("add_bias_linear", True, a.add_bias_linear),
    ]  # fmt: skip
    for name, value, present in routing:
        if present:
            raise _refuse(where, f"{name}={value!r} in a mixture of experts")
    if a.moe_shared_expert_intermediate_size:
        if not (a.moe_shared_expert_gate and a.add_qkv_bias) or a.qk_layernorm or a.window_size is not None:
            raise _refuse(where, "a shared expert is written as Qwen2-MoE only: gated, with a QKV bias")
        return FAMILIES["qwen2_moe"]
    if a.qk_layernorm:
        if a.add_qkv_bias or a.window_size is not None:
            raise _refuse(where, "qk-layernorm experts (Qwen3-MoE) with a QKV bias or a sliding window")
        return FAMILIES["qwen3_moe"]
    if a.add_qkv_bias or a.moe_router_pre_softmax:
        raise _refuse(where, "experts without qk-layernorm are written as Mixtral, whose top-k weights are "
                      "renormalised (moe_router_pre_softmax=false) and which has no QKV bias")  # fmt: skip
    return FAMILIES["mixtral"]


def rope_settings(a: ModelArchitecture) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(`rope_scaling` as transformers < 5 reads it, `rope_parameters` as transformers 5 reads it)."""
    scaling: dict[str, Any] | None = None
    if a.use_rope_scaling:
        scaling = {
            "rope_type": "llama3",
            "factor": a.rope_scaling_factor,
            "low_freq_factor": LLAMA3_LOW_FREQ_FACTOR,
            "high_freq_factor": LLAMA3_HIGH_FREQ_FACTOR,
            "original_max_position_embeddings": LLAMA3_ORIGINAL_MAX_POSITIONS,
        }
    elif a.rotary_seq_len_interpolation_factor:
        scaling = {"rope_type": "linear", "factor": float(a.rotary_seq_len_interpolation_factor)}
    parameters: dict[str, Any] = {"rope_theta": a.rotary_base, **(scaling or {"rope_type": "default"})}
    if a.rotary_percent != 1.0:
        parameters["partial_rotary_factor"] = a.rotary_percent
    return scaling, parameters


def hf_config(
    arch: ModelArchitecture,
    family: HfFamily,
    *,
    vocab_size: int,
    dtype: str,
    bos_token_id: int | None,
    eos_token_id: int | None,
    pad_token_id: int | None = None,
) -> dict[str, Any]:
    """config.json of `arch` written as `family`, with the unpadded `vocab_size` and the weights' `dtype`."""
    a = arch
    scaling, parameters = rope_settings(a)
    config: dict[str, Any] = {
        "architectures": [family.architecture],
        "model_type": family.model_type,
        "vocab_size": vocab_size,
        "hidden_size": a.hidden_size,
        "intermediate_size": a.ffn_hidden_size,
        "num_hidden_layers": a.num_layers,
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_query_groups,
        "head_dim": a.kv_channels,
        "max_position_embeddings": a.max_position_embeddings,
        "hidden_act": "silu",
        "rms_norm_eps": a.norm_epsilon,
        "rope_theta": a.rotary_base,
        "rope_scaling": scaling,
        "rope_parameters": parameters,
        "tie_word_embeddings": not a.untie_embeddings_and_output_weights,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "dtype": dtype,
        "torch_dtype": dtype,
    }
    kind = family.model_type
    if kind == "llama":
        config.update(attention_bias=a.add_bias_linear, mlp_bias=a.add_bias_linear, pretraining_tp=1)
    if kind in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=a.num_layers)
    if kind in ("qwen2", "qwen2_moe"):
        del config["attention_bias"]  # their QKV bias is part of the family, not a setting
    if kind == "qwen2_moe":
        config.update(qkv_bias=True)
    if kind in ("mistral", "mixtral"):
        config["sliding_window"] = None if a.window_size is None else a.window_size[0] + 1
    if a.is_moe:
        config.update(num_experts_per_tok=a.moe_router_topk, output_router_logits=False, router_aux_loss_coef=0.0)
    if kind == "mixtral":
        config.update(num_local_experts=a.num_experts, intermediate_size=a.moe_ffn_hidden_size, router_jitter_noise=0.0)
    if kind in ("qwen2_moe", "qwen3_moe"):
        config.update(
            num_experts=a.num_experts,
            num_local_experts=a.num_experts,  # transformers 5's name for Qwen3-MoE
            moe_intermediate_size=a.moe_ffn_hidden_size,
            norm_topk_prob=not a.moe_router_pre_softmax,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if kind == "qwen2_moe":
        config["shared_expert_intermediate_size"] = a.moe_shared_expert_intermediate_size
    if kind == "llama4_text":
        config.update(
            intermediate_size_mlp=a.ffn_hidden_size,  # its dense MLP's width (intermediate_size: the experts')
            use_qk_norm=a.qk_l2_norm,
            no_rope_layers=[0 if nope else 1 for nope in nope_layers(a)],  # 1: the layer rotates
            moe_layers=[],  # transformers reads the list,
            interleave_moe_layer_step=0,  # vLLM the step (0: no MoE layer)
            # chunked attention on the RoPE layers, in chunks no context fills: plain causal, as megatron's
            attention_chunk_size=a.max_position_embeddings,
            attn_temperature_tuning=False,  # megatron-core does not rescale the queries of its NoPE layers
        )
    if kind == "nemotron":
        del config["rms_norm_eps"]
        config.update(
            hidden_act="relu2",
            norm_eps=a.norm_epsilon,
            partial_rotary_factor=a.rotary_percent,
            attention_bias=a.add_bias_linear,
            mlp_bias=a.add_bias_linear,
        )
    return config


def generation_config(
    family: HfFamily, *, bos_token_id: int | None, eos_token_id: int | None, pad_token_id: int | None
) -> dict[str, Any]:
    """generation_config.json: the tokens generation stops at, the same the builtin server stops at (its EOS).
    For Llama-4 also `attn_temperature_tuning` off: vLLM takes it from here (default on past 32k tokens of
    context), not from config.json."""
    config: dict[str, Any] = {
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
    }
    if family.model_type == "llama4_text":
        config["attn_temperature_tuning"] = False
    return config


def legacy_view(config: dict[str, Any]) -> dict[str, Any]:
    """A config.json with `rope_theta`, `rope_scaling` and `partial_rotary_factor` filled from transformers 5's
    `rope_parameters` where only those are given (what `checkpoint.origin` compares)."""
    config = dict(config.get("text_config") or config)
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict):
        config.setdefault("rope_theta", parameters.get("rope_theta"))
        if "partial_rotary_factor" in parameters:
            config.setdefault("partial_rotary_factor", parameters["partial_rotary_factor"])
        if "rope_scaling" not in config and parameters.get("rope_type", "default") != "default":
            config["rope_scaling"] = {k: v for k, v in parameters.items() if k != "rope_theta"}
    return config


def export_verdict(architecture: dict[str, Any], *, where: str) -> tuple[HfFamily | None, str]:
    """(the family, None when there is none; in words) whether vLLM/SGLang can serve a Megatron checkpoint of
    this architecture (ModelArchitecture's fields; empty when the builtin cannot build it) through an export."""
    if not architecture:
        return None, "export-hf: no, its architecture cannot be read (see problems)"
    try:
        family = hf_family(ModelArchitecture(**architecture), where=where)
    except DeploymentError as exc:
        return None, f"export-hf: no: {exc.message.split(': ', 1)[-1]}"
    except TypeError:  # fields of another version of ModelArchitecture
        return None, "export-hf: unknown (the architecture's fields are not this version's)"
    return family, f"export-hf: yes, as {family.architecture}"
