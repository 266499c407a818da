"""megatron-core's GPT tensors (the local layer spec's state dict) under a Hugging Face family's names.

The inverse of what `evaluate prepare` and the test corpus do: the fused QKV is split per query group
([q heads of the group, k, v]), the fused gate/up projection into its halves, the experts one by one, and
the padded vocabulary rows cut off. Queries and keys are never permuted: megatron-core with
rotary_interleaved rotates adjacent pairs as Llama-4's model does, and without it halves as the other
families do. Every megatron tensor must be used: one left over is an error that names it (a setting the
family would silently drop).
"""

from __future__ import annotations

from typing import Any

from ckpteval.checkpoint.architecture import ModelArchitecture
from ckpteval.checkpoint.hf_export_config import HfFamily
from ckpteval.errors import DeploymentError


def megatron_to_hf(
    state: dict[str, Any], arch: ModelArchitecture, family: HfFamily, *, vocab_size: int
) -> dict[str, Any]:
    """Hugging Face name -> tensor (views of `state`'s tensors) for `family`; the vocabulary cut to `vocab_size`."""
    state = {k: v for k, v in state.items() if not k.endswith("_extra_state")}
    used: set[str] = set()
    out: dict[str, Any] = {}

    def take(key: str) -> Any:
        used.add(key)
        return state[key]

    def copy(src: str, dst: str, *, bias: bool = False) -> None:
        out[dst + ".weight"] = take(src + ".weight")
        if bias or src + ".bias" in state:
            out[dst + ".bias"] = take(src + ".bias")

    out["model.embed_tokens.weight"] = take("embedding.word_embeddings.weight")[:vocab_size]
    if arch.untie_embeddings_and_output_weights:
        out["lm_head.weight"] = take("output_layer.weight")[:vocab_size]
    copy("decoder.final_layernorm", "model.norm")
    groups, head_dim = arch.num_query_groups, arch.kv_channels
    per_group = arch.num_attention_heads // groups
    for i in range(arch.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        for suffix in ("weight", "bias"):
            key = m + f"self_attention.linear_qkv.{suffix}"
            if key not in state:
                continue
            fused = take(key)
            grouped = fused.reshape(groups, (per_group + 2) * head_dim, -1)
            q, k, v = grouped.split([per_group * head_dim, head_dim, head_dim], dim=1)
            for name, part in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                flat = part.reshape(-1, fused.shape[-1]) if suffix == "weight" else part.reshape(-1)
                out[h + f"self_attn.{name}.{suffix}"] = flat
        copy(m + "self_attention.linear_proj", h + "self_attn.o_proj")
        if arch.qk_layernorm:
            copy(m + "self_attention.q_layernorm", h + "self_attn.q_norm")
            copy(m + "self_attention.k_layernorm", h + "self_attn.k_norm")
        copy(m + "input_layernorm", h + "input_layernorm")
        copy(m + "pre_mlp_layernorm", h + "post_attention_layernorm")
        if arch.is_moe:
            _experts(take, state, out, m, h, arch, family)
        else:
            mlp = h + ("feed_forward." if family.model_type == "llama4_text" else "mlp.")  # Llama-4's name
            fc1 = take(m + "mlp.linear_fc1.weight")
            if arch.swiglu:
                gate, up = fc1.chunk(2, dim=0)
                out[mlp + "gate_proj.weight"] = gate
                out[mlp + "up_proj.weight"] = up
            else:
                out[mlp + "up_proj.weight"] = fc1
            if m + "mlp.linear_fc1.bias" in state:
                bias = take(m + "mlp.linear_fc1.bias")
                if arch.swiglu:
                    out[mlp + "gate_proj.bias"], out[mlp + "up_proj.bias"] = bias.chunk(2)
                else:
                    out[mlp + "up_proj.bias"] = bias
            copy(m + "mlp.linear_fc2", mlp + "down_proj")
    left = sorted(set(state) - used)
    if left:
        raise DeploymentError(
            f"The checkpoint has tensors a {family.architecture} has no place for: {', '.join(left[:5])}"
            + (f" (and {len(left) - 5} more)" if len(left) > 5 else "")
            + "."
        )
    return out


def _experts(take: Any, state: dict[str, Any], out: dict[str, Any], m: str, h: str, arch: ModelArchitecture,
             family: HfFamily) -> None:  # fmt: skip
    mixtral = family.model_type == "mixtral"
    block = h + ("block_sparse_moe." if mixtral else "mlp.")
    out[block + "gate.weight"] = take(m + "mlp.router.weight")
    for e in range(int(arch.num_experts or 0)):
        expert = m + f"mlp.experts.local_experts.{e}."
        gate, up = take(expert + "linear_fc1.weight").chunk(2, dim=0)
        down = take(expert + "linear_fc2.weight")
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        for name, tensor in zip(names, (gate, up, down), strict=True):
            out[block + f"experts.{e}.{name}.weight"] = tensor
    if arch.moe_shared_expert_intermediate_size:
        shared = m + "mlp.shared_experts."
        gate, up = take(shared + "linear_fc1.weight").chunk(2, dim=0)
        out[h + "mlp.shared_expert.gate_proj.weight"] = gate
        out[h + "mlp.shared_expert.up_proj.weight"] = up
        out[h + "mlp.shared_expert.down_proj.weight"] = take(shared + "linear_fc2.weight")
        if shared + "gate_weight" in state:
            out[h + "mlp.shared_expert_gate.weight"] = take(shared + "gate_weight")
