"""A GPT model's architecture, read from and written as Megatron-LM training arguments (stdlib only).

Megatron-LM pickles its `args` namespace into every checkpoint's common state and rebuilds the
model from it (`load_args_from_checkpoint`). We read and write the same names, so a real
Megatron-LM checkpoint is understood the same way and ours can be loaded by Megatron-LM.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from ckpteval.checkpoint.forward_args import EXPORT_DEPLOY_GPT, refused_setting
from ckpteval.errors import DeploymentError

_POSITION_TYPES = ("rope", "learned_absolute", "none")
_NORMS = ("LayerNorm", "RMSNorm")
_SCORE_FUNCTIONS = ("softmax", "sigmoid")
_SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
_LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none", "sinkhorn")

LayerPattern = int | tuple[int, ...]  # Megatron-LM's "every Nth layer" or one 0/1 per layer


@dataclass(frozen=True)
class ModelArchitecture:
    """What megatron-core needs to build a GPTModel; field names are Megatron-LM argument names."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    kv_channels: int
    num_query_groups: int
    padded_vocab_size: int
    max_position_embeddings: int
    position_embedding_type: str = "learned_absolute"
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0
    rotary_interleaved: bool = False
    rotary_seq_len_interpolation_factor: float | None = None
    use_rope_scaling: bool = False
    rope_scaling_factor: float = 8.0
    normalization: str = "LayerNorm"
    norm_epsilon: float = 1e-5
    apply_layernorm_1p: bool = False
    qk_layernorm: bool = False
    swiglu: bool = False
    squared_relu: bool = False
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    untie_embeddings_and_output_weights: bool = False
    params_dtype: str = "float32"  # the dtype the model was trained in ("bfloat16" for most runs)
    # activations beyond swiglu / squared_relu / gelu
    quick_geglu: bool = False
    glu_linear_offset: float = 0.0
    activation_func_clamp_value: float | None = None
    # attention variants
    qk_l2_norm: bool = False
    window_size: tuple[int, int] | None = None  # (left, right) tokens; Hugging Face's sliding_window = left + 1
    window_attn_skip_freq: LayerPattern | None = None
    no_rope_freq: LayerPattern | None = None
    softmax_scale: float | None = None
    softmax_type: str = "vanilla"
    # mixture of experts (num_experts None: dense MLPs)
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_router_topk: int = 2
    moe_router_score_function: str = "softmax"
    moe_router_pre_softmax: bool = False
    moe_router_topk_scaling_factor: float | None = None
    moe_router_enable_expert_bias: bool = False
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    moe_router_load_balancing_type: str = "aux_loss"
    moe_shared_expert_intermediate_size: int | None = None
    moe_shared_expert_gate: bool = False
    moe_layer_freq: LayerPattern = 1
    moe_apply_probs_on_input: bool = False

    @property
    def group_query_attention(self) -> bool:
        return self.num_query_groups != self.num_attention_heads

    @classmethod
    def from_args(cls, args: Any, *, where: str, vocab_from_weights: int | None = None) -> ModelArchitecture:
        """Read the architecture from a Megatron-LM args namespace (or any object with those attributes).

        `vocab_from_weights` (the embedding's row count in the checkpoint) fills in the padded vocab
        when the args do not record it. Raises DeploymentError for missing or unsupported settings.
        """

        def get(name: str, default: Any = None) -> Any:
            return getattr(args, name, default)

        refused = refused_setting(args)
        if refused is not None:
            name, value, entry = refused
            raise DeploymentError(
                f"{where}: {name}={value!r} ({entry.why}); the builtin server does not serve it.",
                hint=f"Serve this checkpoint with {entry.serve_with}.",
            )
        missing = [n for n in ("num_layers", "hidden_size", "num_attention_heads") if get(n) is None]
        max_pos = get("max_position_embeddings") or get("seq_length")
        if max_pos is None:
            missing.append("max_position_embeddings")
        vocab = get("padded_vocab_size") or vocab_from_weights
        if vocab is None:
            missing.append("padded_vocab_size")
        if missing:
            raise DeploymentError(
                f"{where}: the checkpoint's args do not say {', '.join(missing)}, so the model cannot be built.",
                hint="Save the checkpoint with Megatron-LM (which stores its args in common.pt), "
                "or re-create it with `evaluate prepare`.",
            )
        hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        swiglu = bool(get("swiglu", False))
        ffn = get("ffn_hidden_size")
        if ffn is None:  # Megatron-LM's own default (validate_args)
            ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
        groups = get("num_query_groups") if get("group_query_attention", False) else None
        position = get("position_embedding_type") or (
            "rope" if get("use_rotary_position_embeddings") else "learned_absolute"
        )
        if get("add_position_embedding") is False and position == "learned_absolute":  # --no-position-embedding
            position = "none"
        normalization = get("normalization") or "LayerNorm"
        _check_choice(where, "position_embedding_type", position, _POSITION_TYPES)
        _check_choice(where, "normalization", normalization, _NORMS)
        score_function = get("moe_router_score_function") or "softmax"
        _check_choice(where, "moe_router_score_function", score_function, _SCORE_FUNCTIONS)
        softmax_type = get("softmax_type") or "vanilla"
        _check_choice(where, "softmax_type", softmax_type, _SOFTMAX_TYPES)
        load_balancing = get("moe_router_load_balancing_type") or "aux_loss"
        if isinstance(load_balancing, list | tuple):  # per-layer-group list since core 0.15; routing uses one
            load_balancing = "sinkhorn" if "sinkhorn" in load_balancing else load_balancing[0]
        _check_choice(where, "moe_router_load_balancing_type", load_balancing, _LOAD_BALANCING)
        if bool(get("swiglu")) + bool(get("squared_relu")) + bool(get("quick_geglu")) > 1:
            raise DeploymentError(
                f"{where}: the args set more than one of swiglu, squared_relu and quick_geglu; "
                "Megatron-LM accepts one activation."
            )
        num_experts = get("num_experts") or None
        add_bias = get("add_bias_linear")
        if add_bias is None and get("disable_bias_linear") is not None:  # older Megatron-LM name
            add_bias = not get("disable_bias_linear")
        trained_in = "bfloat16" if get("bf16") else "float16" if get("fp16") else "float32"
        return cls(
            num_layers=int(get("num_layers")),
            hidden_size=hidden,
            num_attention_heads=heads,
            ffn_hidden_size=int(ffn),
            kv_channels=int(get("kv_channels") or hidden // heads),
            num_query_groups=int(groups or heads),
            padded_vocab_size=int(vocab),  # type: ignore[arg-type]  # checked above
            max_position_embeddings=int(max_pos),
            position_embedding_type=position,
            rotary_base=float(get("rotary_base", 10000) or 10000),
            rotary_percent=float(get("rotary_percent", 1.0) or 1.0),
            rotary_interleaved=bool(get("rotary_interleaved", False)),
            rotary_seq_len_interpolation_factor=get("rotary_seq_len_interpolation_factor"),
            use_rope_scaling=bool(get("use_rope_scaling", False)),
            rope_scaling_factor=float(get("rope_scaling_factor", 8.0) or 8.0),
            normalization=normalization,
            # Megatron-LM renamed these in 2026 (core 0.17): layernorm_epsilon, layernorm_zero_centered_gamma
            norm_epsilon=float(get("norm_epsilon") or get("layernorm_epsilon") or 1e-5),
            apply_layernorm_1p=bool(get("apply_layernorm_1p") or get("layernorm_zero_centered_gamma")),
            qk_layernorm=bool(get("qk_layernorm", False)),
            swiglu=swiglu,
            squared_relu=bool(get("squared_relu", False)),
            add_bias_linear=True if add_bias is None else bool(add_bias),
            add_qkv_bias=bool(get("add_qkv_bias", False)),
            untie_embeddings_and_output_weights=bool(get("untie_embeddings_and_output_weights", False)),
            params_dtype=trained_in,
            quick_geglu=bool(get("quick_geglu", False)),
            glu_linear_offset=float(get("glu_linear_offset") or 0.0),
            activation_func_clamp_value=_optional_float(get("activation_func_clamp_value")),
            qk_l2_norm=bool(get("qk_l2_norm", False)),
            window_size=_window(where, get("window_size")),
            window_attn_skip_freq=_pattern(get("window_attn_skip_freq")),
            no_rope_freq=_pattern(get("no_rope_freq")),
            softmax_scale=_optional_float(get("softmax_scale")),
            softmax_type=softmax_type,
            num_experts=None if num_experts is None else int(num_experts),
            # Megatron-LM's validate_args: the experts are ffn_hidden_size wide unless said otherwise
            moe_ffn_hidden_size=None if num_experts is None else int(get("moe_ffn_hidden_size") or ffn),
            moe_router_topk=int(get("moe_router_topk") or 2),
            moe_router_score_function=score_function,
            moe_router_pre_softmax=bool(get("moe_router_pre_softmax", False)),
            moe_router_topk_scaling_factor=_optional_float(get("moe_router_topk_scaling_factor")),
            moe_router_enable_expert_bias=bool(get("moe_router_enable_expert_bias", False)),
            moe_router_num_groups=get("moe_router_num_groups") or None,
            moe_router_group_topk=get("moe_router_group_topk") or None,
            moe_router_load_balancing_type=load_balancing,
            moe_shared_expert_intermediate_size=get("moe_shared_expert_intermediate_size") or None,
            moe_shared_expert_gate=bool(get("moe_shared_expert_gate", False)),
            moe_layer_freq=_pattern(get("moe_layer_freq")) or 1,
            moe_apply_probs_on_input=bool(get("moe_apply_probs_on_input", False)),
        )

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    def to_args(self, **extra: Any) -> argparse.Namespace:
        """A Megatron-LM-style args namespace for this architecture (plus `extra` arguments)."""
        values = dataclasses.asdict(self)
        trained_in = values.pop("params_dtype")
        values.update(
            group_query_attention=self.group_query_attention,
            use_rotary_position_embeddings=self.position_embedding_type == "rope",
            add_position_embedding=self.position_embedding_type == "learned_absolute",
            seq_length=self.max_position_embeddings,
            bf16=trained_in == "bfloat16",
            fp16=trained_in == "float16",
            ckpt_format="torch_dist",
            # the sizes it is saved with, as Megatron-LM records them (a sharded save passes its own)
            tensor_model_parallel_size=1,
            pipeline_model_parallel_size=1,
            expert_model_parallel_size=1,
        )
        values.update(extra)
        return argparse.Namespace(**values)


def _check_choice(where: str, name: str, value: object, served: tuple[str, ...]) -> None:
    if value not in served:
        raise DeploymentError(
            f"{where}: {name}={value!r} is not served by the builtin server (it serves {', '.join(served)}).",
            hint=f"Serve this checkpoint with {EXPORT_DEPLOY_GPT}.",
        )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _pattern(value: Any) -> LayerPattern | None:
    """Megatron-LM's layer pattern args: an int (every Nth layer) or a list of 0/1, one per layer."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return tuple(int(v) for v in value)
    return int(value)


def _window(where: str, value: Any) -> tuple[int, int] | None:
    """`--window-size` as Megatron-LM parses it: "left,right" into a tuple; (-1, ...) means unlimited."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.strip("()[] ").split(",")
    try:
        left, right = (int(v) for v in value)
    except (TypeError, ValueError):
        raise DeploymentError(f"{where}: window_size={value!r} is not a (left, right) pair of ints.") from None
    if right != 0:
        raise DeploymentError(
            f"{where}: window_size={value!r} lets tokens attend {right} tokens ahead; a causal language model "
            "attends to none.",
            hint=f"Serve this checkpoint with {EXPORT_DEPLOY_GPT}.",
        )
    return None if left < 0 else (left, right)
