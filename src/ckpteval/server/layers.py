"""The layer spec the builtin builds a GPTModel from: megatron-core's local spec, with two modules of ours.

megatron-core's local (non-Transformer-Engine) spec covers every architecture the builtin serves
except two settings, which Transformer Engine handles in Megatron-LM's training runs:
- a zero-centred norm gamma (`apply_layernorm_1p`, Nemotron): the local spec's `WrappedTorchNorm`
  asserts it is off, so `ZeroCenteredNorm` computes `norm(x) * (1 + w) + b` instead (the weights are
  stored zero-centred, as Transformer Engine stores them);
- sliding-window attention (`window_size`): the local `DotProductAttention` builds the window's mask
  on "cuda" and then ignores the mask it is given, which drops the padding of a batch and breaks KV-cache
  decoding. `WindowedDotProductAttention` adds the window to the mask it is given instead.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ckpteval.checkpoint.architecture import ModelArchitecture


def norm_class() -> type:
    """`ZeroCenteredNorm`, defined on first use (it subclasses a torch module)."""
    global _NORM
    if _NORM is None:
        _NORM = _define_norm()
    return _NORM


def windowed_attention_class() -> type:
    """`WindowedDotProductAttention`, defined on first use (it subclasses a megatron module)."""
    global _ATTENTION
    if _ATTENTION is None:
        _ATTENTION = _define_windowed_attention()
    return _ATTENTION


_NORM: type | None = None
_ATTENTION: type | None = None


def _define_norm() -> type:
    import torch

    class ZeroCenteredNorm(torch.nn.Module):
        """LayerNorm or RMSNorm as megatron's norms are built (config, hidden_size, eps), with an optional
        zero-centred gamma: `norm(x) * (1 + weight) + bias` when `config.layernorm_zero_centered_gamma`."""

        def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
            super().__init__()
            self.rms = config.normalization == "RMSNorm"
            self.zero_centered = bool(config.layernorm_zero_centered_gamma)
            self.eps = eps
            self.shape = (hidden_size,)
            self.weight = torch.nn.Parameter(
                torch.zeros(hidden_size) if self.zero_centered else torch.ones(hidden_size)
            )
            self.bias = None if self.rms else torch.nn.Parameter(torch.zeros(hidden_size))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            weight: torch.Tensor = self.weight
            bias: torch.Tensor | None = self.bias
            if self.zero_centered:
                # 1 + w in fp32, as Transformer Engine computes it: in bf16 it would round w to ~0.008
                weight = weight.float() + 1
                bias = None if bias is None else bias.float()
                return self._norm(x.float(), weight, bias).to(x.dtype)
            return self._norm(x, weight, bias)

        def _norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            if self.rms:
                return torch.nn.functional.rms_norm(x, self.shape, weight, self.eps)
            return torch.nn.functional.layer_norm(x, self.shape, weight, bias, self.eps)

    return ZeroCenteredNorm


def _define_windowed_attention() -> type:
    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class WindowedDotProductAttention(DotProductAttention):
        """DotProductAttention whose sliding window is added to the attention mask it is given."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # None on the layers window_attn_skip_freq leaves at full attention
            self.window = self.scale_mask_softmax.window_size
            self.scale_mask_softmax.window_size = None

        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: Any,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            if self.window is not None:
                sq, sk = query.shape[0], key.shape[0]
                # query i sits at key slot sk - sq + i (the KV cache holds the earlier ones)
                q_slot = torch.arange(sk - sq, sk, device=query.device)[:, None]
                k_slot = torch.arange(sk, device=query.device)[None, :]
                left, right = self.window
                outside = (k_slot < q_slot - left) | (k_slot > q_slot + right)
                if attention_mask is None:
                    attention_mask = k_slot > q_slot
                attention_mask = attention_mask | outside
            return super().forward(query, key, value, attention_mask, *args, **kwargs)

    return WindowedDotProductAttention


def _replace_modules(spec: Any, replacements: dict[type, type]) -> None:
    """Swap module classes anywhere in a (nested, mutable) megatron spec."""
    if isinstance(spec, list):
        for item in spec:
            _replace_modules(item, replacements)
        return
    if not dataclasses.is_dataclass(spec):
        return
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if isinstance(value, type) and value in replacements:
            setattr(spec, f.name, replacements[value])
        elif isinstance(value, list) or dataclasses.is_dataclass(value):
            _replace_modules(value, replacements)


def decoder_block_spec(arch: ModelArchitecture, config: Any) -> Any:
    """The TransformerBlockSubmodules of a GPTModel for `arch` (every layer, and the final norm).

    MoE models go through megatron-core's `get_gpt_decoder_block_spec` as Megatron-LM's builder does
    (it places MoE and dense layers by `moe_layer_freq`), with SequentialMLP experts: their sharded keys
    are those grouped-GEMM experts save under too.
    """
    import copy

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    if arch.is_moe:
        spec = get_gpt_decoder_block_spec(
            config, use_transformer_engine=False, normalization=arch.normalization, qk_l2_norm=arch.qk_l2_norm
        )
    else:
        layer = get_gpt_layer_local_spec(
            qk_layernorm=arch.qk_layernorm, normalization=arch.normalization, qk_l2_norm=arch.qk_l2_norm
        )
        # this pipeline stage's layers (all of them at PP=1), as megatron's block spec builds them
        spec = TransformerBlockSubmodules(
            layer_specs=[layer] * get_num_layers_to_build(config), layer_norm=WrappedTorchNorm
        )
    spec = copy.deepcopy(spec)  # megatron's spec functions may share module specs between calls
    replacements: dict[type, type] = {WrappedTorchNorm: norm_class()}
    try:
        from megatron.core.fusions.fused_layer_norm import FusedLayerNorm  # the local spec's norm with Apex

        replacements[FusedLayerNorm] = norm_class()
    except ImportError:
        pass
    if arch.window_size is not None:
        replacements[DotProductAttention] = windowed_attention_class()
    _replace_modules(spec, replacements)
    return spec
