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

from ckpteval.errors import DeploymentError

# Architectures the builtin server cannot build; each needs Export-Deploy on a GPU.
_UNSUPPORTED = {
    "num_experts": "mixture-of-experts layers",
    "multi_latent_attention": "multi-latent attention",
    "hybrid_layer_pattern": "hybrid Mamba layers",
    "hybrid_override_pattern": "hybrid Mamba layers",
    "mtp_num_layers": "multi-token prediction layers",
    "heterogeneous_layers_config_path": "heterogeneous layers",
}
_POSITION_TYPES = ("rope", "learned_absolute", "none")
_NORMS = ("LayerNorm", "RMSNorm")


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

        for name, what in _UNSUPPORTED.items():
            if get(name):
                raise DeploymentError(
                    f"{where}: the model uses {what} ({name}={get(name)!r}), which the builtin server does not serve.",
                    hint="Use deployment.backend=export-deploy (Export-Deploy on GPUs) for this model.",
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
        if position not in _POSITION_TYPES:
            raise DeploymentError(
                f"{where}: position_embedding_type={position!r} is not supported by the builtin server "
                f"(it supports {', '.join(_POSITION_TYPES)}).",
                hint="Use deployment.backend=export-deploy for this model.",
            )
        normalization = get("normalization") or "LayerNorm"
        if normalization not in _NORMS:
            raise DeploymentError(f"{where}: normalization={normalization!r} is not supported ({', '.join(_NORMS)}).")
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
            norm_epsilon=float(get("norm_epsilon", 1e-5) or 1e-5),
            apply_layernorm_1p=bool(get("apply_layernorm_1p", False)),
            qk_layernorm=bool(get("qk_layernorm", False)),
            swiglu=swiglu,
            squared_relu=bool(get("squared_relu", False)),
            add_bias_linear=True if add_bias is None else bool(add_bias),
            add_qkv_bias=bool(get("add_qkv_bias", False)),
            untie_embeddings_and_output_weights=bool(get("untie_embeddings_and_output_weights", False)),
            params_dtype=trained_in,
        )

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
        )
        values.update(extra)
        return argparse.Namespace(**values)
