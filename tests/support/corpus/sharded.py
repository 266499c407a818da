"""Checkpoints saved sharded (TP=2, PP=2, TP=2 x PP=2) by megatron-core itself, from one TP=1 save.

A world of gloo processes on the CPU plays a multi-GPU Megatron-LM job: rank r builds its shard of
the packaged `tiny` model (vocabulary padded for TP=2) for the parallel sizes of the layout, with
ckpteval's own `build_gpt_model`, loads the TP=1 checkpoint into it with `dist_checkpointing`
(megatron resharding it) and saves it again, so every layout holds exactly the TP=1 weights. The
args in common.pt record the parallel sizes as Megatron-LM does. The legacy layouts are what
Megatron-LM's --ckpt-format torch writes: one mp_rank_* state dict per model-parallel rank.

    build_sharded(root)  -> {"tp1": root/tp1, "tp2": root/tp2, "pp2": ..., "legacy_tp2": ...}  (one world)
    build_tp1, build_tp2, build_pp2, build_tp2pp2, build_legacy_tp1, build_legacy_tp2 (out_dir)  (one each)
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The tiny model, with its vocabulary padded as Megatron-LM pads it for TP=2
# (make_vocab_size_divisible_by 128 x TP 2): the embedding must split evenly across the TP ranks.
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128
PADDED_VOCAB = 512
BYTE_VOCAB = 257


@dataclass(frozen=True)
class Parallelism:
    """The model-parallel sizes a checkpoint is saved with."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    legacy: bool = False  # Megatron-LM's legacy `torch` format: one mp_rank_* file per model-parallel rank
    moe: bool = False  # the tiny model with mixture-of-experts MLPs (megatron-core's local MoE spec)

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.ep


LAYOUTS = {
    "tp1": Parallelism(),
    "tp2": Parallelism(tp=2),
    "pp2": Parallelism(pp=2),
    "tp2pp2": Parallelism(tp=2, pp=2),
    "legacy_tp1": Parallelism(legacy=True),
    "legacy_tp2": Parallelism(tp=2, legacy=True),
    "moe_tp1": Parallelism(moe=True),
    "moe_ep2": Parallelism(ep=2, moe=True),
}
MOE_ARGS = {  # Megatron-LM's names; 4 experts, top-2 routing (softmax after top-k: Mixtral's)
    "num_experts": 4,
    "moe_router_topk": 2,
    "moe_ffn_hidden_size": 96,
    "moe_grouped_gemm": False,
    "moe_router_pre_softmax": False,
    "moe_token_dispatcher_type": "allgather",
}


def sharded_architecture(model: str = "tiny") -> Any:
    """The architecture of the saved model: "tiny" (tests), or "bench", SmolLM2-135M's size for the
    load benchmark (30 layers, hidden 576, vocab 49152; 8 heads in 4 groups instead of 9 in 3, which
    TP=2 cannot split)."""
    from ckpteval.server.packaged import TINY_ARCHITECTURE

    tiny = dataclasses.replace(TINY_ARCHITECTURE, padded_vocab_size=PADDED_VOCAB)
    if model == "tiny":
        return tiny
    return dataclasses.replace(
        tiny,
        num_layers=30,
        hidden_size=576,
        num_attention_heads=8,
        num_query_groups=4,
        kv_channels=72,
        ffn_hidden_size=1536,
        padded_vocab_size=49152,
        untie_embeddings_and_output_weights=False,
    )


def build_sharded(root: Path, names: tuple[str, ...] = tuple(LAYOUTS), *, model: str = "tiny") -> dict[str, Path]:
    """Write each named layout under `root/<name>` from one TP=1 save, all in one gloo world.

    The world runs in a child process (`python -m tests.support.corpus.sharded ROOT NAME...`) that
    imports megatron once and forks its ranks: megatron's import takes a minute on a busy machine,
    and the checkpoint writer forks too, which a test process must not do.
    """
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    root.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.corpus.sharded", model, str(root), *names],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"building {names} failed:\n{done.stderr[-4000:]}")
    return {name: root / name for name in names}


def _run_world(model: str, root: Path, names: tuple[str, ...]) -> None:
    # Imported here, before the fork, so the ranks share one import.
    import megatron.core.dist_checkpointing
    import megatron.core.models.gpt  # noqa: F401
    import torch.multiprocessing as mp

    from ckpteval.server.runtime import free_port

    world = max(LAYOUTS[name].model_parallel for name in names)
    with tempfile.TemporaryDirectory(dir=root, prefix=".tp1-source-") as scratch:
        source = Path(scratch) / "tp1"
        targets = {name: root / name for name in names}
        mp.start_processes(
            _rank_main, args=(world, free_port(), source, targets, model), nprocs=world, join=True, start_method="fork"
        )


def build_tp1(out_dir: Path) -> Path:
    """The reference: the tiny model (vocab padded to 512) saved with TP=1, PP=1."""
    return _build_one("tp1", out_dir)


def build_tp2(out_dir: Path) -> Path:
    """The same weights as `build_tp1`, saved by a TP=2 world."""
    return _build_one("tp2", out_dir)


def build_pp2(out_dir: Path) -> Path:
    """The same weights as `build_tp1`, saved by a PP=2 world (one layer per stage)."""
    return _build_one("pp2", out_dir)


def build_tp2pp2(out_dir: Path) -> Path:
    """The same weights as `build_tp1`, saved by a TP=2 x PP=2 world (4 ranks)."""
    return _build_one("tp2pp2", out_dir)


def build_legacy_tp1(out_dir: Path) -> Path:
    """The same weights as `build_tp1` in the legacy `torch` format (iter_N/mp_rank_00/model_optim_rng.pt)."""
    return _build_one("legacy_tp1", out_dir)


def build_legacy_tp2(out_dir: Path) -> Path:
    """The same weights in the legacy `torch` format saved with TP=2 (mp_rank_00, mp_rank_01)."""
    return _build_one("legacy_tp2", out_dir)


def _build_one(name: str, out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{name}-") as scratch:
        built = build_sharded(Path(scratch), (name,))[name]
        shutil.move(built, out_dir)
    return out_dir


def _rank_main(rank: int, world: int, port: int, source: Path, targets: dict[str, Path], model: str) -> None:
    """One rank of the world: make the TP=1 source, then reshard it into each target layout."""
    import torch.distributed as dist

    from ckpteval.server.cpu import apply_cpu_patches
    from ckpteval.server.runtime import quiet_library_logs

    quiet_library_logs()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    apply_cpu_patches()
    sources = {False: source, True: source.with_name("moe_tp1")}  # the dense and the MoE TP=1 saves
    made: set[bool] = set()
    try:
        for name in targets:
            layout = LAYOUTS[name]
            if layout.moe not in made:
                _save_in_world(sources[layout.moe], Parallelism(moe=layout.moe), world, None, model)
                made.add(layout.moe)
            if layout.model_parallel == 1 and not layout.legacy:  # the source itself
                if rank == 0:
                    shutil.copytree(sources[layout.moe], targets[name])
                dist.barrier()
                continue
            _save_in_world(targets[name], layout, world, sources[layout.moe], model)
    finally:
        dist.destroy_process_group()


def _save_in_world(out: Path, layout: Parallelism, world: int, source: Path | None, model: str) -> None:
    from megatron.core import parallel_state

    from ckpteval.server.cpu import initialize_rng_tracker

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        expert_model_parallel_size=layout.ep,
    )
    initialize_rng_tracker()
    try:
        _save_layout(out, layout, world, source=source, model=model)
    finally:
        parallel_state.destroy_model_parallel()


def build_moe_model(arch: Any, *, initialize: bool = False, init_std: float = 0.02) -> Any:
    """The tiny GPT with MoE MLPs (MOE_ARGS), from megatron-core's local spec, for the current parallel state.

    Built here, not with `server.model.build_gpt_model`, until the builtin serves MoE (branch arch).
    """
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        expert_model_parallel_size=parallel_state.get_expert_model_parallel_world_size(),
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        ffn_hidden_size=arch.ffn_hidden_size,
        kv_channels=arch.kv_channels,
        normalization=arch.normalization,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        num_moe_experts=MOE_ARGS["num_experts"],
        moe_router_topk=MOE_ARGS["moe_router_topk"],
        moe_ffn_hidden_size=MOE_ARGS["moe_ffn_hidden_size"],
        moe_grouped_gemm=False,
        moe_token_dispatcher_type="allgather",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        use_cpu_initialization=True,
        perform_initialization=initialize,
        init_method_std=init_std,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
    )
    spec = get_gpt_layer_local_spec(
        num_experts=MOE_ARGS["num_experts"], moe_grouped_gemm=False, normalization=arch.normalization
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=arch.padded_vocab_size,
        max_sequence_length=arch.max_position_embeddings,
        share_embeddings_and_output_weights=not arch.untie_embeddings_and_output_weights,
        position_embedding_type=arch.position_embedding_type,
    ).eval()


def _save_layout(out: Path, layout: Parallelism, world: int, *, source: Path | None, model: str) -> None:
    import torch
    import torch.distributed as dist

    from ckpteval.checkpoint.layout import TOKENIZER_DIR
    from ckpteval.server.model import build_gpt_model, load_weights, save_checkpoint
    from ckpteval.server.packaged import TINY_INIT_STD, TINY_SEED
    from ckpteval.server.tokenizer import write_byte_tokenizer

    arch = sharded_architecture(model)
    build = build_moe_model if layout.moe else build_gpt_model
    if source is None:
        torch.manual_seed(TINY_SEED)  # the same weights on every rank: each is a data-parallel replica
        gpt = build(arch, initialize=True, init_std=TINY_INIT_STD)
    else:
        gpt = build(arch)
        load_weights(gpt, source / "iter_0000000")
    args = arch.to_args(
        tokenizer_type="HuggingFaceTokenizer",
        tokenizer_model=None,
        vocab_size=BYTE_VOCAB,
        make_vocab_size_divisible_by=MAKE_VOCAB_SIZE_DIVISIBLE_BY,
        world_size=world,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=None,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.tp,
        context_parallel_size=1,
        data_parallel_size=world // (layout.tp * layout.pp),
        **(MOE_ARGS if layout.moe else {}),
    )
    if layout.legacy:
        args.ckpt_format = "torch"
        _save_legacy(gpt, out, args=args)
    else:
        save_checkpoint(gpt, out, args=args)
    if dist.get_rank() == 0:
        write_byte_tokenizer(out / TOKENIZER_DIR)
    dist.barrier()


def _save_legacy(model: Any, root: Path, *, args: Any) -> None:
    """What Megatron-LM's `save_checkpoint` writes with --ckpt-format torch and the Transformer Engine
    spec (its default): each model-parallel rank of data-parallel rank 0 saves its state dict, with the
    norms under their Transformer Engine names (the local spec's keys map, applied)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    from ckpteval.checkpoint.layout import TRACKER_FILE
    from ckpteval.server.model import CHECKPOINT_VERSION

    args.iteration = 0
    keys_map = model.decoder.layers[0].submodules_config.sharded_state_dict_keys_map
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("_extra_state"):
            continue
        for local, te in keys_map.items():
            name = name.replace(f".{local}", f".{te}")
        state[name] = tensor
    if parallel_state.get_data_parallel_rank() == 0:
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        rank_dir = f"mp_rank_{tp_rank:02d}"
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            rank_dir += f"_{parallel_state.get_pipeline_model_parallel_rank():03d}"
        path = root / "iter_0000000" / rank_dir / "model_optim_rng.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"args": args, "checkpoint_version": CHECKPOINT_VERSION, "iteration": 0, "model": state}
        torch.save(payload, path)
    if dist.get_rank() == 0:
        (root / TRACKER_FILE).write_text("0")
    dist.barrier()


if __name__ == "__main__":
    import sys

    _run_world(sys.argv[1], Path(sys.argv[2]), tuple(sys.argv[3:]))
