"""Checkpoints in Megatron-Bridge's layout, written with megatron-core itself (Bridge cannot be installed here).

`build_bridge_llama(out_dir, release=...)` writes a tiny Llama-3-style model (GQA, RoPE with Llama-3
scaling, RMSNorm, SwiGLU, tied embeddings, bf16) the way Megatron-Bridge's `save_checkpoint` does
for that release (see `ckpteval.checkpoint.bridge` for the files each release writes):

    <out>/latest_train_state.pt, <out>/latest_checkpointed_iteration.txt (not for 0.1.x)
    <out>/iter_0000010/{run_config.yaml, train_state.pt, common.pt (no args), .metadata, *.distcp}
    <out>/iter_0000010/tokenizer/   the byte tokenizer, as save_pretrained() writes it (not before 0.2.0)

`run_config.yaml` starts from `bridge_run_config_0.3.1.yaml`, which Megatron-Bridge 0.3.1 itself wrote
(`ConfigContainer.to_yaml` of a recipe's config with an AutoBridge Llama provider; regenerate with
`python -m tests.support.corpus.bridge template OUT`); its `model:` section is megatron-core 0.16.1's
TransformerConfig fields plus GPTModelProvider's. Older releases wrote the same structure (their
ConfigContainer and GPTModelProvider differ by fields the model does not use, and no `hf_model_id`
before 0.2.0).

With `megatron_lm_twin`, the same weights are also saved in Megatron-LM's layout (args in common.pt),
so a test can compare what is served from each.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from ckpteval.checkpoint.architecture import ModelArchitecture

RELEASES = ("0.1.0rc4", "0.2.0rc6", "0.3.1")
TEMPLATE = Path(__file__).with_name("bridge_run_config_0.3.1.yaml")
ITERATION = 10
HF_MODEL_ID = "meta-llama/Llama-3.2-1B"
TRAINING_TOKENIZER_PATH = "/lustre/run/tokenizer"  # the training machine's path: absent here
SEED = 4321
INIT_STD = 0.3  # wide, so the random model's predictions are peaked and differ between positions

BRIDGE_LLAMA = ModelArchitecture(
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    ffn_hidden_size=128,
    kv_channels=16,
    num_query_groups=2,
    padded_vocab_size=384,  # 257 byte-tokenizer ids, padded to make_vocab_size_divisible_by=128
    max_position_embeddings=256,
    position_embedding_type="rope",
    rotary_base=500000.0,
    use_rope_scaling=True,
    rope_scaling_factor=8.0,
    normalization="RMSNorm",
    swiglu=True,
    add_bias_linear=False,
    untie_embeddings_and_output_weights=False,
    params_dtype="bfloat16",
)
BYTE_VOCAB = 257


def _features(release: str) -> dict[str, bool]:
    version = tuple(int(p) for p in release.split("rc")[0].split("."))
    final_02 = version >= (0, 2, 0) and "rc" not in release  # v0.2.0 added hf_model_id and the tokenizer copy
    return {
        "text_tracker": version >= (0, 2, 0),  # latest_checkpointed_iteration.txt, since 0.2.0rc
        "hf_model_id": final_02 or version > (0, 2, 0),
        "tokenizer_copy": final_02 or version > (0, 2, 0),
    }


def build_bridge_llama(out_dir: Path, release: str = "0.3.1", *, megatron_lm_twin: Path | None = None) -> Path:
    """Write the tiny Llama in Megatron-Bridge `release`'s layout at `out_dir` (a child process); return it."""
    if release not in RELEASES:
        raise ValueError(f"unknown Megatron-Bridge release {release!r}; known: {', '.join(RELEASES)}")
    command = [sys.executable, "-m", "tests.support.corpus.bridge", "build", str(out_dir), release]
    if megatron_lm_twin is not None:
        command.append(str(megatron_lm_twin))
    repo = Path(__file__).resolve().parents[3]
    result = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"building the Bridge checkpoint failed:\n{result.stderr[-3000:]}")
    return out_dir


def to_release(root: Path, release: str) -> Path:
    """Turn a 0.3.1-layout checkpoint at `root` into what `release` writes, by removing what it did not."""
    import shutil

    import yaml

    features = _features(release)
    iter_dir = root / f"iter_{ITERATION:07d}"
    if not features["text_tracker"]:
        (root / "latest_checkpointed_iteration.txt").unlink(missing_ok=True)
    if not features["tokenizer_copy"]:
        shutil.rmtree(iter_dir / "tokenizer", ignore_errors=True)
    if not features["hf_model_id"]:
        with open(iter_dir / "run_config.yaml", "w") as handle:
            yaml.safe_dump(run_config(BRIDGE_LLAMA, release, root), handle, default_flow_style=False)
    return root


def run_config(arch: ModelArchitecture, release: str, root: Path) -> dict[str, Any]:
    """The ConfigContainer dict Bridge would save for `arch` (from the template Bridge 0.3.1 wrote)."""
    import yaml

    config = yaml.safe_load(TEMPLATE.read_text())
    model = config["model"]
    model.update(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        ffn_hidden_size=arch.ffn_hidden_size,
        kv_channels=arch.kv_channels,
        seq_length=arch.max_position_embeddings,
        vocab_size=BYTE_VOCAB,  # setup: the tokenizer's size, padded because should_pad_vocab
        should_pad_vocab=True,
        make_vocab_size_divisible_by=128,
        rotary_base=int(arch.rotary_base),
        rope_scaling=arch.use_rope_scaling,
        rope_scaling_factor=arch.rope_scaling_factor,
        normalization=arch.normalization,
        layernorm_epsilon=arch.norm_epsilon,
        gated_linear_unit=arch.swiglu,
        activation_func={"_target_": "torch.nn.functional.silu", "_call_": False},
        add_bias_linear=arch.add_bias_linear,
        share_embeddings_and_output_weights=not arch.untie_embeddings_and_output_weights,
        bf16=True,
        params_dtype={"_target_": "torch.bfloat16", "_call_": False},
    )
    model["hf_model_id"] = HF_MODEL_ID
    if not _features(release)["hf_model_id"]:
        del model["hf_model_id"]
        del config["checkpoint"]["save_tokenizer_assets"]
    config["dataset"]["seq_length"] = arch.max_position_embeddings
    config["checkpoint"]["save"] = config["checkpoint"]["load"] = str(root)
    config["tokenizer"].update(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=TRAINING_TOKENIZER_PATH)
    return dict(config)


def _build(out_dir: Path, release: str, twin: Path | None) -> None:
    import shutil

    import torch
    import yaml
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    from ckpteval.server.model import build_gpt_model, save_checkpoint
    from ckpteval.server.runtime import init_runtime
    from ckpteval.server.tokenizer import write_byte_tokenizer

    init_runtime("cpu")
    torch.manual_seed(SEED)
    model = build_gpt_model(BRIDGE_LLAMA, dtype="bfloat16", initialize=True, init_std=INIT_STD)
    iter_dir = out_dir / f"iter_{ITERATION:07d}"
    iter_dir.mkdir(parents=True)
    # Bridge's generate_state_dict(): no "args"; the model under "model"; content metadata in common.pt
    metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    state = {
        "checkpoint_version": 3.0,
        "iteration": ITERATION,
        "model": model.sharded_state_dict(prefix="", metadata=metadata),
    }
    strategy = TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=1)
    dist_checkpointing.save(state, str(iter_dir), sharded_strategy=strategy, content_metadata=metadata)

    # train_state_finalize_fn(): train_state.pt, the global copy, the text tracker, run_config.yaml, tokenizer
    train_state = {
        "step": torch.tensor(ITERATION, dtype=torch.int32),
        "consumed_train_samples": torch.tensor(ITERATION * 32, dtype=torch.int32),
        "skipped_train_samples": torch.tensor(0, dtype=torch.int32),
        "consumed_valid_samples": torch.tensor(0, dtype=torch.int32),
        "floating_point_operations_so_far": torch.tensor(1.0e12, dtype=torch.float32),
        "do_train": torch.tensor(True),
        "do_valid": torch.tensor(False),
        "do_test": torch.tensor(False),
    }
    torch.save(train_state, iter_dir / "train_state.pt")
    shutil.copy(iter_dir / "train_state.pt", out_dir / "latest_train_state.pt")
    (out_dir / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
    with open(iter_dir / "run_config.yaml", "w") as handle:
        yaml.safe_dump(run_config(BRIDGE_LLAMA, "0.3.1", out_dir), handle, default_flow_style=False)
    write_byte_tokenizer(iter_dir / "tokenizer")
    to_release(out_dir, release)

    if twin is not None:
        args = BRIDGE_LLAMA.to_args(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=None, vocab_size=BYTE_VOCAB)
        save_checkpoint(model, twin, args=args, iteration=ITERATION)
        write_byte_tokenizer(twin / "tokenizer")


def _write_template(out: Path) -> None:
    """Regenerate bridge_run_config_0.3.1.yaml with Megatron-Bridge 0.3.1 itself (downloads its wheel)."""
    import tempfile

    from tests.support.megatron_bridge import bridge_source, import_bridge

    source = bridge_source("0.3.1")
    if isinstance(source, str):
        raise SystemExit(source)
    import_bridge(source)
    from megatron.bridge import AutoBridge
    from megatron.bridge.recipes.common import _pretrain_common
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config
    from transformers import LlamaConfig

    hf_dir = tempfile.mkdtemp()
    LlamaConfig(
        vocab_size=BYTE_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
        tie_word_embeddings=True,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(hf_dir)
    cfg = _pretrain_common()
    cfg.model = AutoBridge.from_hf_pretrained(hf_dir).to_megatron_provider(load_weights=False)
    cfg.model.hf_model_id = HF_MODEL_ID
    cfg.mixed_precision = get_mixed_precision_config("bf16_mixed")
    cfg.mixed_precision.finalize()
    cfg.mixed_precision.setup(cfg.model, cfg.optimizer, cfg.ddp)
    cfg.model.vocab_size, cfg.model.should_pad_vocab = BYTE_VOCAB, True
    cfg.checkpoint.save = cfg.checkpoint.load = "/training/run/checkpoints"
    cfg.logger.tensorboard_dir = "/training/run/tb_logs"
    cfg.to_yaml(str(out))


if __name__ == "__main__":
    if sys.argv[1] == "template":
        _write_template(Path(sys.argv[2]))
    else:
        _build(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]) if len(sys.argv) > 4 else None)
