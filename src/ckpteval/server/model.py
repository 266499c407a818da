"""Build a megatron-core GPTModel from an architecture, and load or save its torch_dist weights.

The model uses megatron-core's local layer spec (no Transformer Engine), whose state-dict keys are
the Transformer-Engine names Megatron-LM trains with, so a user's checkpoint loads unchanged.
Callers run `runtime.init_runtime()` first.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.checkpoint.architecture import ModelArchitecture
from ckpteval.checkpoint.layout import TRACKER_FILE, iteration_dir_name, legacy_state_file
from ckpteval.errors import DeploymentError
from ckpteval.server.checkpoint import checkpoint_tensor_shapes
from ckpteval.server.runtime import torch_dtype

if TYPE_CHECKING:
    from megatron.core.models.gpt import GPTModel

CHECKPOINT_VERSION = 3.0  # Megatron-LM's current common-state version


def transformer_config(
    arch: ModelArchitecture,
    *,
    dtype: str = "float32",
    initialize: bool = False,
    init_std: float = 0.02,
    **overrides: Any,
) -> Any:
    """megatron-core's TransformerConfig for `arch`, for serving (no dropout, unfused kernels).

    Parallel sizes come from megatron's parallel state, so the same function builds the model a
    checkpoint is saved from under tensor or expert parallelism (`overrides`: config fields such as
    tensor_model_parallel_size=2 or expert_model_parallel_size=2, matching the initialised parallel state).
    """
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.activations import squared_relu
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer.transformer_config import TransformerConfig

    params_dtype = torch_dtype(dtype)
    activation: Any
    if arch.swiglu:
        activation = F.silu
    elif arch.quick_geglu:
        activation = quick_gelu
    elif arch.squared_relu:
        activation = squared_relu
    else:
        activation = F.gelu
    moe: dict[str, Any] = {}
    if arch.is_moe:
        moe = dict(
            num_moe_experts=arch.num_experts,
            moe_ffn_hidden_size=arch.moe_ffn_hidden_size,
            moe_router_topk=arch.moe_router_topk,
            moe_router_score_function=arch.moe_router_score_function,
            moe_router_pre_softmax=arch.moe_router_pre_softmax,
            moe_router_topk_scaling_factor=arch.moe_router_topk_scaling_factor,
            moe_router_enable_expert_bias=arch.moe_router_enable_expert_bias,
            moe_router_num_groups=arch.moe_router_num_groups,
            moe_router_group_topk=arch.moe_router_group_topk,
            moe_router_load_balancing_type=arch.moe_router_load_balancing_type,
            moe_shared_expert_intermediate_size=arch.moe_shared_expert_intermediate_size,
            moe_shared_expert_gate=arch.moe_shared_expert_gate,
            moe_layer_freq=list(arch.moe_layer_freq) if isinstance(arch.moe_layer_freq, tuple) else arch.moe_layer_freq,
            moe_apply_probs_on_input=arch.moe_apply_probs_on_input,
            # the one dispatcher that runs in one process without CUDA streams; same function as alltoall
            moe_token_dispatcher_type="allgather",
            moe_grouped_gemm=False,
            moe_aux_loss_coeff=0.0,
        )
    parallel = {
        "tensor_model_parallel_size": parallel_state.get_tensor_model_parallel_world_size(),
        "pipeline_model_parallel_size": parallel_state.get_pipeline_model_parallel_world_size(),
        "expert_model_parallel_size": parallel_state.get_expert_model_parallel_world_size(),
    }
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        ffn_hidden_size=arch.ffn_hidden_size,
        kv_channels=arch.kv_channels,
        normalization=arch.normalization,
        layernorm_epsilon=arch.norm_epsilon,
        layernorm_zero_centered_gamma=arch.apply_layernorm_1p,  # read by layers.ZeroCenteredNorm
        qk_layernorm=arch.qk_layernorm,
        qk_l2_norm=arch.qk_l2_norm,
        gated_linear_unit=arch.swiglu or arch.quick_geglu,
        activation_func=activation,
        glu_linear_offset=arch.glu_linear_offset,
        activation_func_clamp_value=arch.activation_func_clamp_value,
        add_bias_linear=arch.add_bias_linear,
        add_qkv_bias=arch.add_qkv_bias,
        rotary_interleaved=arch.rotary_interleaved,
        window_size=arch.window_size,
        window_attn_skip_freq=_layer_pattern(arch.window_attn_skip_freq),
        no_rope_freq=_layer_pattern(arch.no_rope_freq),
        softmax_scale=arch.softmax_scale,
        softmax_type=arch.softmax_type,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # The fused kernels are CUDA extensions; the unfused paths are exact on any device.
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        use_cpu_initialization=True,
        perform_initialization=initialize,
        init_method_std=init_std,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=dtype == "bfloat16",
        fp16=dtype == "float16",
        **{**parallel, **moe, **overrides},
    )


def _layer_pattern(pattern: int | tuple[int, ...] | None) -> int | list[int] | None:
    return list(pattern) if isinstance(pattern, tuple) else pattern


def build_gpt_model(
    arch: ModelArchitecture,
    *,
    dtype: str = "float32",
    initialize: bool = False,
    init_std: float = 0.02,
    config_overrides: dict[str, Any] | None = None,
) -> GPTModel:
    """A GPTModel on the CPU in eval mode; random weights (normal, `init_std`) only with `initialize`.

    Built under megatron's current parallel state: one whole model in a server (`runtime.init_runtime`);
    with tensor, pipeline or expert parallelism initialised (a test world that saves sharded
    checkpoints), each rank gets its shard, which is how a sharded checkpoint of the same model is saved.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    from ckpteval.server.layers import decoder_block_spec

    if arch.is_moe:
        from ckpteval.server.cpu import allow_moe_without_transformer_engine

        allow_moe_without_transformer_engine()
    config = transformer_config(arch, dtype=dtype, initialize=initialize, init_std=init_std, **(config_overrides or {}))
    pipeline_size = parallel_state.get_pipeline_model_parallel_world_size()
    model = GPTModel(
        config=config,
        transformer_layer_spec=decoder_block_spec(arch, config),
        vocab_size=arch.padded_vocab_size,
        max_sequence_length=arch.max_position_embeddings,
        share_embeddings_and_output_weights=not arch.untie_embeddings_and_output_weights,
        position_embedding_type=arch.position_embedding_type,
        rotary_percent=arch.rotary_percent,
        rotary_base=int(arch.rotary_base),
        rope_scaling=arch.use_rope_scaling,
        rope_scaling_factor=arch.rope_scaling_factor,
        seq_len_interpolation_factor=arch.rotary_seq_len_interpolation_factor,
        pre_process=pipeline_size == 1 or parallel_state.is_pipeline_first_stage(),
        post_process=pipeline_size == 1 or parallel_state.is_pipeline_last_stage(),
    )
    cast_parameters(model, torch_dtype(dtype))
    return model.eval()


def cast_parameters(model: Any, dtype: Any) -> None:
    """Every parameter in `dtype`, the norms included.

    megatron-core builds its norms without `params_dtype`, so in a bf16 model their weights stay
    fp32, and every forward mixes dtypes (torch then falls back from its fused kernels). Only
    parameters are cast: buffers such as RoPE's inverse frequencies keep their precision.
    """
    for parameter in model.parameters():
        if parameter.dtype != dtype:
            parameter.data = parameter.data.to(dtype)


def _model_tensors(model: GPTModel) -> dict[str, tuple[int, ...]]:
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return {
        t.key: tuple(t.global_shape)
        for t in model.sharded_state_dict(prefix="").values()
        if isinstance(t, ShardedTensor)
    }


def check_matches_checkpoint(model: GPTModel, iter_dir: Path) -> None:
    """Raise DeploymentError naming the tensors the checkpoint lacks or has with another shape."""
    stored = checkpoint_tensor_shapes(iter_dir)
    missing, mismatched = [], []
    for key, shape in _model_tensors(model).items():
        if key not in stored:
            missing.append(key)
        elif stored[key] != shape:
            mismatched.append(f"{key}: checkpoint {list(stored[key])}, config {list(shape)}")
    if missing or mismatched:
        lines = [f"missing {k}" for k in missing[:5]] + mismatched[:5]
        more = len(missing) + len(mismatched) - len(lines)
        raise DeploymentError(
            f"The weights in {iter_dir} do not match the architecture in its args: "
            + "; ".join(lines)
            + (f" (and {more} more)" if more > 0 else "")
            + ".",
            hint="The args in common.pt must describe the saved model (layers, sizes, vocab, "
            "GQA groups, swiglu, tied embeddings).",
        )


def check_no_unexpected_tensors(model: GPTModel, arch: ModelArchitecture, iter_dir: Path, *, ignore: bool) -> None:
    """Raise DeploymentError naming the checkpoint's tensors the model does not have (and the arg that
    probably went missing), unless `ignore` (--ignore-unexpected-tensors): megatron would leave them unread."""
    import dataclasses

    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedBase

    from ckpteval.checkpoint.unexpected_tensors import SERVER_ALLOW, explain, is_model_tensor, refuse_unexpected

    if ignore or legacy_state_file(iter_dir) is not None:  # a legacy checkpoint's loader refuses them itself
        return
    built = {t.key for t in nested_values(model.sharded_state_dict(prefix="")) if isinstance(t, ShardedBase)}
    extra = [key for key in checkpoint_tensor_shapes(iter_dir) if is_model_tensor(key) and key not in built]
    refuse_unexpected(explain(dataclasses.asdict(arch), extra), str(iter_dir), allow=SERVER_ALLOW)


def load_weights(model: GPTModel, iter_dir: Path) -> None:
    """Fill `model` with the weights of an iteration directory (shapes checked first; run
    `check_no_unexpected_tensors` before it).

    torch_dist is resharded by megatron to the model's parallel sizes, whatever it was saved with;
    a legacy `torch` checkpoint (TP=PP=1 only, see `layout`) is one plain state dict.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    if legacy_state_file(iter_dir) is not None:
        _load_legacy_weights(model, iter_dir)
        return
    check_matches_checkpoint(model, iter_dir)
    loaded = dist_checkpointing.load(
        {"model": model.sharded_state_dict(prefix="")},
        str(iter_dir),
        # optimizer and rng state are not needed to serve; model tensors the model lacks were refused before
        # (check_no_unexpected_tensors) unless the user allowed them
        strict=StrictHandling.ASSUME_OK_UNEXPECTED,
    )
    result = model.load_state_dict(loaded["model"], strict=True)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing:
        raise DeploymentError(f"{iter_dir} did not provide {', '.join(missing[:5])}.")


def _legacy_names(name: str, keys_maps: list[dict[str, str]]) -> list[str]:
    """The names a parameter may have in a legacy state dict: the model's own (local spec), or the
    Transformer Engine name Megatron-LM trains with by default (the layer spec's keys map, applied)."""
    names = [name]
    for keys_map in keys_maps:
        for local, te in keys_map.items():
            if f".{local}" in name:
                names.append(name.replace(f".{local}", f".{te}", 1))
    return names


def _load_legacy_weights(model: GPTModel, iter_dir: Path) -> None:
    from ckpteval.server.checkpoint import legacy_model_state

    stored = legacy_model_state(iter_dir)
    keys_maps = [layer.submodules_config.sharded_state_dict_keys_map for layer in model.decoder.layers]
    weights, used, missing, mismatched = {}, set(), [], []
    for name, tensor in model.state_dict().items():
        if name.endswith("_extra_state"):
            continue
        found = next((n for n in _legacy_names(name, keys_maps) if n in stored), None)
        if found is None:
            missing.append(name)
        elif tuple(stored[found].shape) != tuple(tensor.shape):
            mismatched.append(f"{found}: checkpoint {list(stored[found].shape)}, config {list(tensor.shape)}")
        else:
            weights[name] = stored[found]
            used.add(found)
    unexpected = [k for k in stored if k not in used and not k.endswith("_extra_state")]
    if missing or mismatched or unexpected:
        lines = [f"missing {k}" for k in missing[:5]] + mismatched[:5] + [f"unexpected {k}" for k in unexpected[:5]]
        raise DeploymentError(
            f"The weights in {legacy_state_file(iter_dir)} do not match the architecture in its args: "
            + "; ".join(lines)
            + ".",
            hint="The args saved with it must describe the saved model (layers, sizes, vocab, GQA groups, "
            "swiglu, tied embeddings).",
        )
    model.load_state_dict(weights, strict=False)


def save_checkpoint(
    model: GPTModel,
    root: Path,
    *,
    args: argparse.Namespace,
    iteration: int = 0,
    extra_common: dict[str, Any] | None = None,
) -> Path:
    """Write `model` as Megatron-LM does: <root>/iter_NNNNNNN (torch_dist) and the tracker file.

    `args` goes into the common state under "args", like Megatron-LM's training arguments.
    Must run under an `if __name__ == "__main__"` guard: the writer forks and spawns processes.
    In a world of several ranks every rank calls it with its shard; rank 0 writes the directories.
    """
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    first_rank = dist.get_rank() == 0
    iter_dir = root / iteration_dir_name(iteration)
    if first_rank:
        iter_dir.mkdir(parents=True, exist_ok=False)
    dist.barrier()
    args.iteration = iteration
    state = {
        "model": model.sharded_state_dict(prefix=""),
        "args": args,
        "checkpoint_version": CHECKPOINT_VERSION,
        "iteration": iteration,
        **(extra_common or {}),
    }
    # One writer thread: one data file and one forked writer instead of two.
    strategy = TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=1)
    dist_checkpointing.save(state, str(iter_dir), sharded_strategy=strategy)
    if first_rank:
        (root / TRACKER_FILE).write_text(str(iteration))
    return iter_dir
