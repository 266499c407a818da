"""Tiny checkpoints of each architecture the builtin serves, made from a Hugging Face transformers model.

Each `build_<name>(out_dir)` makes a random tiny model of that family with transformers, converts its
weights to megatron-core's GPT names, and writes a real torch_dist Megatron checkpoint (args in
common.pt, as Megatron-LM writes them) with the byte tokenizer in `out_dir/tokenizer`. The transformers
model is saved beside it (`hf_reference_dir(out_dir)`) as the parity reference. The writer forks, so
the work runs in a child process (`python -m tests.support.corpus.architectures NAME OUT_DIR`).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckpteval.checkpoint.architecture import ModelArchitecture

VOCAB = 257  # the byte tokenizer's ids
SEED = 22
INIT_STD = 0.2  # wide enough that the random model's greedy tokens are not all one id
COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    initializer_range=INIT_STD,
    bos_token_id=None,
    eos_token_id=256,
    pad_token_id=None,
)


def _config(name: str) -> Any:
    """The Hugging Face config of architecture `name` (tiny)."""
    import transformers as t

    configs: dict[str, Callable[[], Any]] = {
        "llama3": lambda: t.LlamaConfig(
            **COMMON,
            intermediate_size=96,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
        "qwen2": lambda: t.Qwen2Config(**COMMON, intermediate_size=96, tie_word_embeddings=True),
        "qwen3": lambda: t.Qwen3Config(**COMMON, intermediate_size=96, tie_word_embeddings=False),
        "mistral_window": lambda: t.MistralConfig(
            **COMMON, intermediate_size=96, sliding_window=5, tie_word_embeddings=False
        ),
        "mixtral_moe": lambda: t.MixtralConfig(
            **COMMON, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False
        ),
        "qwen3_moe": lambda: t.Qwen3MoeConfig(
            **COMMON,
            intermediate_size=96,
            moe_intermediate_size=24,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            tie_word_embeddings=False,
        ),
        "qwen2_moe": lambda: t.Qwen2MoeConfig(
            **COMMON,
            intermediate_size=96,
            moe_intermediate_size=24,
            shared_expert_intermediate_size=40,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            tie_word_embeddings=False,
        ),
        # Llama-4's text model, dense: L2-normed queries and keys on every (RoPE) layer
        "llama4_qk_l2_norm": lambda: _llama4(use_qk_norm=True, no_rope_layers=[1, 1]),
        # and without the qk-norm, its second layer without RoPE (NoPE)
        "llama4_no_rope": lambda: _llama4(use_qk_norm=False, no_rope_layers=[1, 0]),
        "nemotron4": lambda: t.NemotronConfig(
            **COMMON, intermediate_size=96, partial_rotary_factor=0.5, tie_word_embeddings=False
        ),
    }
    return configs[name]()


def _llama4(**settings: Any) -> Any:
    import transformers as t

    return t.Llama4TextConfig(
        **COMMON,
        intermediate_size=24,
        intermediate_size_mlp=96,
        moe_layers=[],
        attn_temperature_tuning=False,  # a NoPE-layer query scaling megatron-core does not have
        attention_chunk_size=8192,  # longer than any test sequence: chunked attention is plain causal
        tie_word_embeddings=False,
        **settings,
    )


NAMES = (
    "llama3",
    "qwen2",
    "qwen3",
    "mistral_window",
    "mixtral_moe",
    "qwen3_moe",
    "qwen2_moe",
    "nemotron4",
    "llama4_qk_l2_norm",
    "llama4_no_rope",
)


def architecture_of(name: str, config: Any) -> ModelArchitecture:
    """The Megatron architecture (Megatron-LM arg names) of the Hugging Face config of `name`."""
    rope = getattr(config, "rope_parameters", None) or {}
    base = dict(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        ffn_hidden_size=config.intermediate_size,
        kv_channels=config.head_dim,
        num_query_groups=config.num_key_value_heads,
        padded_vocab_size=config.vocab_size,
        max_position_embeddings=config.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=float(rope.get("rope_theta", 10000.0)),
        normalization="RMSNorm",
        norm_epsilon=float(getattr(config, "rms_norm_eps", None) or getattr(config, "norm_eps", 1e-5)),
        swiglu=True,
        add_bias_linear=False,
        untie_embeddings_and_output_weights=not config.tie_word_embeddings,
    )
    if name == "llama3":
        base.update(use_rope_scaling=True, rope_scaling_factor=rope["factor"])
    if name in ("qwen2", "qwen2_moe"):
        base.update(add_qkv_bias=True)
    if name in ("qwen3", "qwen3_moe"):
        base.update(qk_layernorm=True)
    if name == "mistral_window":
        # Hugging Face's sliding_window W lets a token see itself and the W - 1 before it
        base.update(window_size=(config.sliding_window - 1, 0))
    if name == "nemotron4":
        base.update(
            normalization="LayerNorm",
            apply_layernorm_1p=True,
            swiglu=False,
            squared_relu=True,
            rotary_percent=rope.get("partial_rotary_factor", 1.0),
        )
    if name == "mixtral_moe":
        # softmax over the top-k logits = the top-k probabilities renormalised (Mixtral)
        base.update(num_experts=config.num_local_experts, moe_ffn_hidden_size=config.intermediate_size)
    if name in ("qwen3_moe", "qwen2_moe"):
        # norm_topk_prob=False: softmax over every expert, the top-k weights not renormalised
        base.update(
            num_experts=config.num_experts,
            moe_ffn_hidden_size=config.moe_intermediate_size,
            moe_router_pre_softmax=not config.norm_topk_prob,
        )
    if name == "qwen2_moe":
        base.update(
            moe_shared_expert_intermediate_size=config.shared_expert_intermediate_size, moe_shared_expert_gate=True
        )
    if "moe" in name:
        base.update(moe_router_topk=config.num_experts_per_tok)
    if name.startswith("llama4"):
        # Llama-4 rotates adjacent pairs (complex multiplication); its no_rope_layers marks RoPE layers with 1
        base.update(
            ffn_hidden_size=config.intermediate_size_mlp,
            rotary_interleaved=True,
            qk_l2_norm=config.use_qk_norm,
            no_rope_freq=None if all(config.no_rope_layers) else tuple(1 - r for r in config.no_rope_layers),
        )
    return ModelArchitecture(**base)  # type: ignore[arg-type]


def hf_to_megatron(hf: dict[str, Any], arch: ModelArchitecture) -> dict[str, Any]:
    """Map Hugging Face weights (Llama, Qwen2/3, Mistral, Mixtral, Qwen-MoE, Nemotron) to megatron-core GPT names."""
    import torch

    groups, head_dim = arch.num_query_groups, arch.kv_channels
    per_group = arch.num_attention_heads // groups
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"]}
    if arch.untie_embeddings_and_output_weights:
        out["output_layer.weight"] = hf["lm_head.weight"]

    def norm(src: str, dst: str) -> None:
        out[dst + ".weight"] = hf[src + ".weight"]
        if src + ".bias" in hf:
            out[dst + ".bias"] = hf[src + ".bias"]

    def qkv(hf_prefix: str, suffix: str) -> torch.Tensor:
        # megatron's fused QKV is laid out per query group: [q heads of the group, k, v]
        q = hf[f"{hf_prefix}q_proj.{suffix}"].reshape(groups, per_group * head_dim, -1)
        k = hf[f"{hf_prefix}k_proj.{suffix}"].reshape(groups, head_dim, -1)
        v = hf[f"{hf_prefix}v_proj.{suffix}"].reshape(groups, head_dim, -1)
        fused = torch.cat([q, k, v], dim=1)
        return fused.reshape(-1, fused.shape[-1]) if suffix == "weight" else fused.reshape(-1)

    norm("model.norm", "decoder.final_layernorm")
    for i in range(arch.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = h + "self_attn."
        out[m + "self_attention.linear_qkv.weight"] = qkv(attn, "weight")
        if attn + "q_proj.bias" in hf:
            out[m + "self_attention.linear_qkv.bias"] = qkv(attn, "bias")
        out[m + "self_attention.linear_proj.weight"] = hf[attn + "o_proj.weight"]
        if arch.qk_layernorm:
            out[m + "self_attention.q_layernorm.weight"] = hf[attn + "q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = hf[attn + "k_norm.weight"]
        norm(h + "input_layernorm", m + "input_layernorm")
        norm(h + "post_attention_layernorm", m + "pre_mlp_layernorm")
        if arch.is_moe:
            out[m + "mlp.router.weight"] = hf[h + "mlp.gate.weight"]
            gate_up, down = hf[h + "mlp.experts.gate_up_proj"], hf[h + "mlp.experts.down_proj"]  # [E, 2I, H], [E, H, I]
            for e in range(gate_up.shape[0]):
                out[m + f"mlp.experts.local_experts.{e}.linear_fc1.weight"] = gate_up[e]
                out[m + f"mlp.experts.local_experts.{e}.linear_fc2.weight"] = down[e]
            if arch.moe_shared_expert_intermediate_size:
                shared = h + "mlp.shared_expert."
                out[m + "mlp.shared_experts.linear_fc1.weight"] = torch.cat(
                    [hf[shared + "gate_proj.weight"], hf[shared + "up_proj.weight"]]
                )
                out[m + "mlp.shared_experts.linear_fc2.weight"] = hf[shared + "down_proj.weight"]
                if arch.moe_shared_expert_gate:
                    out[m + "mlp.shared_experts.gate_weight"] = hf[h + "mlp.shared_expert_gate.weight"]
        else:
            mlp = h + ("feed_forward." if h + "feed_forward.up_proj.weight" in hf else "mlp.")  # Llama-4's name
            up = hf[mlp + "up_proj.weight"]
            out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[mlp + "gate_proj.weight"], up]) if arch.swiglu else up
            out[m + "mlp.linear_fc2.weight"] = hf[mlp + "down_proj.weight"]
    return out


def hf_reference_dir(out_dir: Path) -> Path:
    """Where `build_<name>(out_dir)` saves the transformers model the checkpoint was made from."""
    return out_dir.with_name(out_dir.name + "-hf")


def _randomize(model: Any) -> None:
    """Norm weights and biases random too (transformers sets them to 1 and 0), so that a norm the
    converter or the server got wrong shows in the log-probabilities."""
    import torch

    generator = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for key, param in model.named_parameters():
            if "norm" in key:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1 + (0.0 if "nemotron" in key else 1.0))
            elif key.endswith(".bias") or "shared_expert_gate" in key:
                param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)


def write_architecture(name: str, out_dir: Path) -> Path:
    """Build checkpoint `name` in this process (call it in a child process: the writer forks)."""
    import torch
    import transformers

    from ckpteval.checkpoint.layout import TOKENIZER_DIR
    from ckpteval.server.model import build_gpt_model, save_checkpoint
    from ckpteval.server.runtime import init_runtime, quiet_library_logs
    from ckpteval.server.tokenizer import write_byte_tokenizer

    quiet_library_logs()
    config = _config(name)
    torch.manual_seed(SEED)
    hf_model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _randomize(hf_model)
    if name == "nemotron4":  # zero-centred gammas: random around 0 (the model multiplies by 1 + w)
        with torch.no_grad():
            for key, param in hf_model.named_parameters():
                if "norm" in key and key.endswith("weight"):
                    param.sub_(1.0)
    hf_model.save_pretrained(str(hf_reference_dir(out_dir)))

    arch = architecture_of(name, config)
    init_runtime("cpu")
    model = build_gpt_model(arch)
    result = model.load_state_dict(hf_to_megatron(hf_model.state_dict(), arch), strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"{name}: conversion left weights unmapped: {missing[:4]} {result.unexpected_keys[:4]}")
    write_byte_tokenizer(out_dir / TOKENIZER_DIR)
    args = arch.to_args(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=None, vocab_size=VOCAB)
    save_checkpoint(model, out_dir, args=args, extra_common={"ckpteval": {"source": f"tests corpus {name}"}})
    return out_dir


def _build(name: str, out_dir: Path) -> Path:
    build_many({name: out_dir})
    return out_dir


def build_many(targets: dict[str, Path]) -> dict[str, Path]:
    """Build several architectures (name -> out_dir) in one child process (imports once: ~30 s saved each)."""
    root = Path(__file__).resolve().parents[3]
    pairs = [item for name, out_dir in targets.items() for item in (name, str(out_dir))]
    subprocess.run([sys.executable, "-m", "tests.support.corpus.architectures", *pairs], check=True, cwd=root)
    return targets


def build_llama3(out_dir: Path) -> Path:
    """Dense Llama-3 style: GQA, RoPE with Llama-3.1 scaling (theta 500000), untied embeddings."""
    return _build("llama3", out_dir)


def build_qwen2(out_dir: Path) -> Path:
    """Qwen2 style: bias on the QKV projection only, tied embeddings."""
    return _build("qwen2", out_dir)


def build_qwen3(out_dir: Path) -> Path:
    """Qwen3 style: per-head RMSNorm on queries and keys, untied embeddings."""
    return _build("qwen3", out_dir)


def build_mistral_window(out_dir: Path) -> Path:
    """Mistral with a 5-token sliding window (window_size=(4, 0))."""
    return _build("mistral_window", out_dir)


def build_mixtral_moe(out_dir: Path) -> Path:
    """Mixtral: 4 experts, top-2, renormalised weights."""
    return _build("mixtral_moe", out_dir)


def build_qwen3_moe(out_dir: Path) -> Path:
    """Qwen3-MoE: 4 experts, top-2, weights not renormalised (moe_router_pre_softmax), qk-layernorm."""
    return _build("qwen3_moe", out_dir)


def build_qwen2_moe(out_dir: Path) -> Path:
    """Qwen2-MoE: routed experts plus a sigmoid-gated shared expert, QKV bias."""
    return _build("qwen2_moe", out_dir)


def build_llama4_qk_l2_norm(out_dir: Path) -> Path:
    """Llama-4 text (dense): parameter-free L2 norm on queries and keys (qk_l2_norm), interleaved RoPE."""
    return _build("llama4_qk_l2_norm", out_dir)


def build_llama4_no_rope(out_dir: Path) -> Path:
    """Llama-4 text (dense): the second layer without RoPE (no_rope_freq=[0, 1])."""
    return _build("llama4_no_rope", out_dir)


def build_nemotron4(out_dir: Path) -> Path:
    """Nemotron-4: LayerNorm with zero-centred gamma (layernorm-1p) and bias, squared ReLU, half-rotary RoPE."""
    return _build("nemotron4", out_dir)


if __name__ == "__main__":
    for i in range(1, len(sys.argv), 2):
        write_architecture(sys.argv[i], Path(sys.argv[i + 1]))
