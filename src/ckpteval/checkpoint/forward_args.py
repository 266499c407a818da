"""Every Megatron-LM argument that changes a GPT model's forward pass at inference, and what the builtin does with it.

Megatron-LM builds its `TransformerConfig` from the args of the same names
(`core_transformer_config_from_args` copies every field `args` has; since 2026 the args are even
generated from the config's fields), plus a few args the model builder passes to `GPTModel`
(position embedding, vocab, tied embeddings). So the table is keyed by arg name, and each entry
says which config fields it sets: `tests/unit/checkpoint/test_forward_args.py` fails when a field of
the installed megatron-core's `TransformerConfig` is in neither this table nor `NO_FORWARD_FIELDS`,
so an upgrade that adds one has to be classified before it can be served silently wrong.

- "served": `ModelArchitecture.from_args` reads it and `model.build_gpt_model` honours it.
- "refused": the builtin cannot run it; `from_args` raises DeploymentError when a checkpoint sets it
  to anything but one of its `harmless` values.
- "no-effect": recorded in the args but the forward Megatron-LM trains and serves with does not
  depend on it (a precision guard, an implementation choice with the same function).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["served", "refused", "no-effect"]

# The Export-Deploy configurations named in refusals (ckpteval's `deployment.*` settings).
EXPORT_DEPLOY_GPT = "deployment.backend=export-deploy (Export-Deploy's --model_type gpt, the default)"
EXPORT_DEPLOY_MAMBA = (
    "deployment.backend=export-deploy with deployment.model_type=mamba (Export-Deploy's --model_type mamba; "
    "it builds megatron-core's MambaModel and needs mamba-ssm and causal-conv1d on the GPUs)"
)


@dataclass(frozen=True)
class ForwardArg:
    """How the builtin treats one forward-changing arg."""

    status: Status
    why: str
    harmless: tuple[object, ...] = (None, False)  # values that leave the forward as Megatron-LM's default
    config_fields: tuple[str, ...] = ()  # the TransformerConfig fields it sets (default: the arg's own name)
    serve_with: str = ""  # refused: what serves it
    in_config: bool = True  # False: not a TransformerConfig field (the model builder or the legacy model reads it)

    def is_harmless(self, value: object) -> bool:
        """Whether `value` leaves the forward unchanged (never for a refused arg set to anything else)."""
        return any(value is h or (type(value) is type(h) and value == h) for h in self.harmless)


def _served(why: str, *fields: str, harmless: tuple[object, ...] = (None, False), in_config: bool = True) -> ForwardArg:
    return ForwardArg("served", why, harmless, fields, in_config=in_config)


def _refused(
    why: str,
    *fields: str,
    harmless: tuple[object, ...] = (None, False),
    serve_with: str = "",
    in_config: bool = True,
) -> ForwardArg:
    return ForwardArg("refused", why, harmless, fields, serve_with or EXPORT_DEPLOY_GPT, in_config)


def _no_effect(why: str, *fields: str, in_config: bool = True) -> ForwardArg:
    return ForwardArg("no-effect", why, (), fields, in_config=in_config)


_MOE_WHY = "mixture-of-experts routing, served with megatron-core's own router and SequentialMLP experts"

FORWARD_ARGS: dict[str, ForwardArg] = {
    # sizes (every one also shapes the weights, so a wrong one fails the shape check at load)
    "num_layers": _served("transformer layers"),
    "hidden_size": _served("model width"),
    "num_attention_heads": _served("query heads"),
    "group_query_attention": _served("whether num_query_groups applies", "num_query_groups"),
    "num_query_groups": _served("key/value heads (GQA)"),
    "kv_channels": _served("head dimension"),
    "ffn_hidden_size": _served("MLP width"),
    "padded_vocab_size": _served("embedding and output rows (GPTModel's vocab_size)", in_config=False),
    "max_position_embeddings": _served("learned position table size; the longest context served", in_config=False),
    "untie_embeddings_and_output_weights": _served(
        "separate output layer instead of the embedding's transpose", in_config=False
    ),
    # position embedding (GPTModel arguments, not config fields)
    "position_embedding_type": _served(
        "rope, learned_absolute and none are served; yarn, mrope and relative are refused by from_args",
        harmless=("learned_absolute",),
        in_config=False,
    ),
    "use_rotary_position_embeddings": _served("pre-2024 spelling of position_embedding_type=rope", in_config=False),
    "add_position_embedding": _served(
        "pre-2024 spelling (False: position_embedding_type=none)", harmless=(True,), in_config=False
    ),
    "rotary_base": _served("RoPE theta", harmless=(10000,), in_config=False),
    "rotary_percent": _served(
        "share of each head's dimensions RoPE rotates (Nemotron: 0.5)", harmless=(1.0,), in_config=False
    ),
    "rotary_interleaved": _served("RoPE pairs adjacent dimensions instead of halves", "rotary_interleaved"),
    "rotary_seq_len_interpolation_factor": _served("linear RoPE position interpolation", in_config=False),
    "use_rope_scaling": _served("Llama-3.1 RoPE frequency scaling", in_config=False),
    "rope_scaling_factor": _served(
        "Llama-3.1 RoPE scaling factor (note: Megatron-LM's gpt_builders does not pass it, so a Megatron-LM "
        "run used megatron-core's default 8.0 whatever this says; the builtin honours the arg)",
        harmless=(8.0,),
        in_config=False,
    ),
    "no_rope_freq": _served("layers without RoPE (Llama-4 style NoPE layers)", "no_rope_freq"),
    "rope_type": _refused(
        "RoPE variant for MLA (rope or yarn); plain attention supports only rope",
        harmless=(None, "rope"),
        in_config=False,
    ),
    "mrope_section": _refused("multimodal RoPE sections (position_embedding_type=mrope)", "mrope_section"),
    # normalisation
    "normalization": _served("LayerNorm or RMSNorm (L2Norm is refused by from_args)", harmless=("LayerNorm",)),
    "norm_epsilon": _served("norm epsilon (Megatron-LM <= core 0.16 name)", "layernorm_epsilon", harmless=(1e-5,)),
    "layernorm_epsilon": _served("norm epsilon (Megatron-LM name since 2026)", "layernorm_epsilon", harmless=(1e-5,)),
    "apply_layernorm_1p": _served(
        "zero-centred LayerNorm gamma, y = norm(x) * (1 + w) (Nemotron; Megatron-LM <= core 0.16 name)",
        "layernorm_zero_centered_gamma",
    ),
    "layernorm_zero_centered_gamma": _served("apply_layernorm_1p's name since 2026", "layernorm_zero_centered_gamma"),
    "qk_layernorm": _served("norm on queries and keys per head (Qwen3, OLMo-2)"),
    "qk_l2_norm": _served("parameter-free L2 norm on queries and keys (Llama-4)"),
    # MLP
    "swiglu": _served("gated SiLU MLP", "gated_linear_unit", "activation_func"),
    "squared_relu": _served("squared-ReLU MLP activation (Nemotron-4)", "activation_func"),
    "quick_geglu": _served("gated quick-GELU MLP (x * sigmoid(1.702 x))", "gated_linear_unit", "activation_func"),
    "glu_linear_offset": _served("offset added to the GLU's linear half", harmless=(0.0,)),
    "activation_func_clamp_value": _served("clamp of the GLU's inputs (gpt-oss)"),
    "add_bias_linear": _served("biases in every linear layer", harmless=(True,)),
    "disable_bias_linear": _served("older spelling of add_bias_linear=False", "add_bias_linear"),
    "add_qkv_bias": _served("bias in the QKV projection only (Qwen2)"),
    # attention
    "softmax_scale": _served("attention score scale instead of 1/sqrt(kv_channels)"),
    "softmax_type": _served("vanilla, off-by-one or learnable softmax offset (gpt-oss sinks)", harmless=("vanilla",)),
    "window_size": _served("sliding-window attention, (left, right) tokens (Mistral, Gemma-2/3, gpt-oss)"),
    "window_attn_skip_freq": _served("which layers use full attention when window_size is set"),
    "attention_output_gate": _refused(
        "sigmoid gate on the attention output (Qwen3-Next): megatron-core's local attention runs it only "
        "with a split QKV and it is not checked against a reference here",
    ),
    "apply_query_key_layer_scaling": _no_effect(
        "divides the scores by the layer number and multiplies them back inside an fp32 softmax (an fp16 "
        "overflow guard): the same function"
    ),
    "attention_softmax_in_fp32": _no_effect("precision of the softmax only; the builtin's softmax runs in fp32"),
    # mixture of experts
    "num_experts": _served(_MOE_WHY + ": the experts per MoE layer", "num_moe_experts"),
    "moe_ffn_hidden_size": _served("each routed expert's width"),
    "moe_router_topk": _served("experts per token", harmless=(2,)),
    "moe_router_score_function": _served("softmax or sigmoid router scores", harmless=("softmax",)),
    "moe_router_pre_softmax": _served("softmax over all experts before top-k (Mixtral) instead of after"),
    "moe_router_topk_scaling_factor": _served("scale of the top-k weights (DeepSeek-V3)"),
    "moe_router_enable_expert_bias": _served("per-expert score bias used for choosing experts (DeepSeek-V3)"),
    "moe_router_num_groups": _served("group-limited routing: expert groups (DeepSeek-V3)"),
    "moe_router_group_topk": _served("group-limited routing: groups chosen per token"),
    "moe_shared_expert_intermediate_size": _served("width of the always-on shared expert (Qwen2-MoE, DeepSeek)"),
    "moe_shared_expert_gate": _served("sigmoid gate on the shared expert (Qwen2-MoE)"),
    "moe_layer_freq": _served("which layers are MoE, the others dense", harmless=(1,)),
    "moe_apply_probs_on_input": _served("routing weights applied to the expert input instead of its output"),
    "moe_expert_capacity_factor": _refused(
        "token dropping: a token beyond an expert's capacity skips it, so a token's output depends on the "
        "other tokens in the batch; the builtin routes every token (dropless)",
    ),
    "moe_latent_size": _refused("experts run in a projected latent space (not in the local spec)"),
    "moe_router_dtype": _no_effect("precision of the router's logits only"),
    "moe_grouped_gemm": _no_effect(
        "grouped-GEMM experts: megatron-core saves them under SequentialMLP's keys, the same function"
    ),
    "moe_input_jitter_eps": _no_effect(
        "random noise on the router input, a training regulariser; the builtin serves without it (megatron-core "
        "would apply it in eval mode too, so every score would be random)"
    ),
    "moe_router_load_balancing_type": _served(
        "sinkhorn changes routing at inference too (sigmoid scores); the aux-loss kinds only add training losses",
        harmless=("aux_loss", "seq_aux_loss", "global_aux_loss", "none"),
    ),
    "moe_token_dispatcher_type": _no_effect("how tokens reach experts across GPUs; the same function"),
    # architectures the builtin cannot build
    "multi_latent_attention": _refused(
        "multi-latent attention (DeepSeek-V2/V3): low-rank KV projections the local GPT spec does not build",
        "multi_latent_attention",
    ),
    "hybrid_override_pattern": _refused(
        "hybrid Mamba layers: megatron-core's Mamba mixer needs mamba-ssm's and causal-conv1d's CUDA kernels",
        "is_hybrid_model",
        "mamba_state_dim",
        "mamba_head_dim",
        "mamba_num_groups",
        "mamba_num_heads",
        "use_mamba_mem_eff_path",
        serve_with=EXPORT_DEPLOY_MAMBA,
    ),
    "hybrid_layer_pattern": _refused(
        "hybrid Mamba layers (the pattern's 2026 name)", "is_hybrid_model", serve_with=EXPORT_DEPLOY_MAMBA
    ),
    "is_hybrid_model": _refused("hybrid Mamba model", "is_hybrid_model", serve_with=EXPORT_DEPLOY_MAMBA),
    "mtp_num_layers": _refused("multi-token-prediction layers (DeepSeek-V3, Qwen3-Next)", "mtp_num_layers"),
    "heterogeneous_layers_config_path": _refused(
        "layers of different shapes (Llama-Nemotron NAS models)", "heterogeneous_block_specs"
    ),
    "experimental_attention_variant": _refused(
        "experimental attention (gated delta net, DeepSeek sparse attention)",
        "experimental_attention_variant",
        "dsa_indexer_n_heads",
        "dsa_indexer_head_dim",
        "dsa_indexer_topk",
    ),
    "linear_attention_freq": _refused(
        "linear-attention layers (Qwen3-Next gated delta net)",
        "linear_attention_freq",
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
    ),
    "spec": _refused("a custom layer spec module: the builtin builds megatron-core's GPT spec only", in_config=False),
    # legacy (non-mcore) model only: Megatron-LM's megatron-core GPT ignores them
    "openai_gelu": _no_effect(
        "read only by Megatron-LM's legacy model; the megatron-core GPT ignores it", in_config=False
    ),
    "onnx_safe": _no_effect(
        "read only by Megatron-LM's legacy model; the megatron-core GPT ignores it", in_config=False
    ),
    "apply_residual_connection_post_layernorm": _no_effect(
        "megatron-core's TransformerLayer never reads it (only the legacy model did)",
        "apply_residual_connection_post_layernorm",
    ),
    "fp32_residual_connection": _no_effect("precision of the residual stream only", "fp32_residual_connection"),
}


def _group(why: str, names: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), why)


# TransformerConfig / ModelParallelConfig fields that leave the inference forward unchanged (with why).
NO_FORWARD_FIELDS: dict[str, str] = {
    **_group(
        "dropout: off when serving",
        "hidden_dropout attention_dropout",
    ),
    **_group(
        "initialisation only: the weights come from the checkpoint",
        "init_method output_layer_init_method init_method_std embedding_init_method embedding_init_method_std "
        "init_model_with_meta_device perform_initialization use_cpu_initialization",
    ),
    **_group(
        "parallel layout or communication: the weights are resharded at load and the function is the same",
        "tensor_model_parallel_size pipeline_model_parallel_size virtual_pipeline_model_parallel_size "
        "sequence_parallel context_parallel_size hierarchical_context_parallel_sizes hybrid_context_parallel "
        "expert_model_parallel_size expert_tensor_parallel_size moe_extended_tp max_seqlen_per_dp_cp_rank "
        "num_layers_in_first_pipeline_stage num_layers_in_last_pipeline_stage pipeline_model_parallel_layout "
        "account_for_embedding_in_pipeline_split account_for_loss_in_pipeline_split cp_comm_type "
        "pipeline_model_parallel_comm_backend microbatch_group_size_per_vp_stage variable_seq_lengths "
        "overlap_p2p_comm overlap_p2p_comm_warmup_flush batch_p2p_comm batch_p2p_sync use_ring_exchange_p2p "
        "deallocate_pipeline_outputs async_tensor_model_parallel_allreduce tp_comm_overlap tp_comm_bulk_wgrad "
        "tp_comm_bulk_dgrad tp_comm_overlap_ag tp_comm_overlap_rs tp_comm_overlap_rs_dgrad tp_comm_split_ag "
        "tp_comm_atomic_ag tp_comm_split_rs tp_comm_atomic_rs tp_comm_bootstrap_backend tp_comm_overlap_disable_qkv "
        "tp_comm_overlap_disable_fc1 cross_entropy_loss_fusion cross_entropy_fusion_impl "
        "overlap_moe_expert_parallel_comm ep_overlap_early_attn_memory_release delay_wgrad_compute "
        "moe_shared_expert_overlap moe_enable_deepep moe_flex_dispatcher_backend moe_deepep_num_sms "
        "moe_hybridep_num_sms moe_router_topk_limited_devices moe_permute_fusion moe_router_fusion "
        "symmetric_ar_type inference_fuse_tp_communication mtp_standalone",
    ),
    **_group(
        "training only (gradients, losses, optimiser hooks, recomputation, offloading)",
        "gradient_accumulation_fusion defer_embedding_wgrad_compute wgrad_deferral_limit grad_scale_func "
        "no_sync_func grad_sync_func param_sync_func finalize_model_grads_func "
        "num_microbatches_with_partial_activation_checkpoints "
        "recompute_granularity recompute_method recompute_num_layers distribute_saved_activations "
        "recompute_modules moe_layer_recompute calculate_per_token_loss mtp_loss_scaling_factor "
        "moe_aux_loss_coeff moe_z_loss_coeff moe_router_bias_update_rate "
        "moe_router_force_load_balancing moe_enable_routing_replay moe_per_layer_logging moe_token_dropping "
        "qk_clip qk_clip_alpha qk_clip_threshold log_max_attention_logit cpu_offloading cpu_offloading_num_layers "
        "cpu_offloading_activations cpu_offloading_weights cpu_offloading_double_buffering _cpu_offloading_context "
        "fine_grained_activation_offloading offload_modules min_offloaded_tensor_size "
        "clone_scatter_output_in_embedding disable_parameter_transpose_cache",
    ),
    **_group(
        "fused kernels with exact unfused equivalents (the builtin turns them off on the CPU)",
        "bias_activation_fusion masked_softmax_fusion persist_layer_norm memory_efficient_layer_norm "
        "bias_dropout_fusion apply_rope_fusion use_fused_weighted_squared_relu fused_single_qkv_rope "
        "activation_func_fp8_input_store use_te_activation_func mlp_chunks_for_prefill",
    ),
    **_group(
        "numeric precision and quantised-training recipes: the checkpoint's weights are high precision "
        "and the builtin computes in the dtype it serves in",
        "fp16 bf16 params_dtype pipeline_dtype autocast_dtype enable_autocast "
        "disable_bf16_reduced_precision_matmul fp8 fp8_recipe fp8_param fp8_quantizer_factory fp8_margin "
        "fp8_interval fp8_amax_history_len fp8_amax_compute_algo fp8_wgrad fp8_dot_product_attention "
        "fp8_multi_head_attention tp_only_amax_red first_last_layers_bf16 num_layers_at_start_in_bf16 "
        "num_layers_at_end_in_bf16 fp4 fp4_recipe fp4_param fp4_quantizer_factory use_kitchen "
        "use_kitchen_attention kitchen_attention_backend quant_recipe moe_router_padding_for_quantization "
        "moe_router_padding_for_fp8 batch_invariant_mode deterministic_mode",
    ),
    **_group(
        "implementation choices with the same function (attention kernel, layer implementation, CUDA graphs)",
        "attention_backend transformer_impl use_inference_optimized_layers enable_cuda_graph "
        "cuda_graph_use_single_mempool cuda_graph_retain_backward_graph cuda_graph_warmup_steps "
        "external_cuda_graph cuda_graph_impl cuda_graph_scope flash_decode use_te_rng_tracker "
        "inference_rng_tracker inference_sampling_seed hetereogenous_dist_checkpoint moe_use_legacy_grouped_gemm "
        "moe_pad_expert_input_to_capacity moe_token_drop_policy",
    ),
    **_group(
        "logging, timing and debugging only",
        "timers barrier_with_L1_time config_logger_dir test_mode",
    ),
    **_group(
        "refused together with the arg that enables it (dsa_*, see experimental_attention_variant)",
        "dsa_indexer_loss_coeff dsa_indexer_use_sparse_loss",
    ),
}


def config_fields_covered() -> set[str]:
    """The TransformerConfig fields `FORWARD_ARGS` and `NO_FORWARD_FIELDS` classify."""
    covered = set(NO_FORWARD_FIELDS)
    for name, entry in FORWARD_ARGS.items():
        if entry.in_config:
            covered.update(entry.config_fields or (name,))
    return covered


def refused_setting(args: object) -> tuple[str, object, ForwardArg] | None:
    """The first refused arg `args` sets to a value that changes the forward, or None."""
    for name, entry in FORWARD_ARGS.items():
        if entry.status != "refused":
            continue
        value = getattr(args, name, None)
        if not entry.is_harmless(value):
            return name, value, entry
    return None


def forward_settings(args: object) -> list[tuple[str, object, ForwardArg]]:
    """Every forward-changing arg `args` sets to a non-default value, in table order (for inspection)."""
    missing = object()
    found = []
    for name, entry in FORWARD_ARGS.items():
        value = getattr(args, name, missing)
        if value is missing or (entry.status != "no-effect" and entry.is_harmless(value)):
            continue
        if entry.status == "no-effect" and value in (None, False):
            continue
        found.append((name, value, entry))
    return found
