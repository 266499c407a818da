"""Megatron-Bridge checkpoints, read into the Megatron-LM argument names the rest of ckpteval uses.

Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge) saves megatron-core `torch_dist` weights under the same
keys as Megatron-LM, but keeps no `args` in `common.pt`. Checked against its source, releases
0.1.0rc4, 0.2.0rc6 and 0.3.1 (wheels) and the tags v0.2.0-v0.3.1 (`training/checkpointing.py`,
`training/utils/checkpoint_utils.py`, `training/model_load_save.py`):

    <root>/latest_train_state.pt                 torch file: TrainState.state_dict() (`step`, ...); all releases
    <root>/latest_checkpointed_iteration.txt     the step; since 0.2.0rc (0.1 writes only the .pt tracker)
    <root>/iter_0000100/run_config.yaml          ConfigContainer.to_yaml(): `model:` (the provider, e.g.
                                                 GPTModelProvider, with megatron-core TransformerConfig's
                                                 fields), `tokenizer:` (TokenizerConfig), train, optimizer ...
    <root>/iter_0000100/train_state.pt           the same TrainState
    <root>/iter_0000100/tokenizer/               a copy of the tokenizer (since v0.2.0, save_tokenizer_assets):
                                                 save_pretrained() for HuggingFaceTokenizer, else the files
                                                 renamed (vocab.json + merges.txt, tokenizer.model, and
                                                 TikTokenizer's vocabulary as tokenizer.json)
    <root>/iter_0000100/common.pt, .metadata, __*.distcp, metadata.json   megatron-core torch_dist

`model.hf_model_id` (since v0.2.0) is the Hugging Face model a run was converted from
(`get_hf_model_id_from_checkpoint`). Functions are YAML `{_target_: torch.nn.functional.silu,
_call_: false}`, dtypes `{_target_: torch.bfloat16, _call_: false}`, enums `{_target_: ..., _call_:
true, _args_: [value]}`.

The provider's fields are megatron-core TransformerConfig fields, which Megatron-LM fills from
args of the same name (`core_transformer_config_from_args`); Bridge's own reverse map
(`mlm_compat/arguments.py`) renames a few. So every field is copied under its Megatron-LM name and
`ModelArchitecture.from_args` (with the forward-args table) decides what it serves: none is dropped.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import argparse
import re
from pathlib import Path
from typing import Any

from ckpteval.errors import DeploymentError

CONFIG_FILE = "run_config.yaml"
TRAIN_STATE_FILE = "train_state.pt"
TRAIN_STATE_TRACKER = "latest_train_state.pt"  # TRACKER_PREFIX "latest" + TRAIN_STATE_FILE
TOKENIZER_DIR = "tokenizer"

# Provider field -> Megatron-LM arg, where the names differ (Bridge's mlm_compat/arguments.py, reversed).
_RENAMED = {
    "num_moe_experts": "num_experts",
    "layernorm_epsilon": "norm_epsilon",
    "layernorm_zero_centered_gamma": "apply_layernorm_1p",
    "seq_len_interpolation_factor": "rotary_seq_len_interpolation_factor",
    "rope_scaling": "use_rope_scaling",
    "num_layers_in_first_pipeline_stage": "decoder_first_pipeline_num_layers",
    "num_layers_in_last_pipeline_stage": "decoder_last_pipeline_num_layers",
}
# Fields handled below, not copied as they are.
_SPECIAL = {
    "_target_",
    "activation_func",
    "gated_linear_unit",
    "share_embeddings_and_output_weights",
    "num_query_groups",
    "vocab_size",
    "should_pad_vocab",
    "params_dtype",
    "pipeline_dtype",
    "autocast_dtype",
    "transformer_layer_spec",
    "hybrid_override_pattern",
}

# Activation functions (`_target_` of model.activation_func) -> the Megatron-LM flag that selects it
# with and without gated_linear_unit. Megatron-LM has no flag for the others (e.g. a gated GELU).
_ACTIVATIONS: dict[tuple[str, bool], dict[str, bool]] = {
    ("torch.nn.functional.gelu", False): {},
    ("torch.nn.functional.silu", True): {"swiglu": True},
    ("megatron.core.activations.squared_relu", False): {"squared_relu": True},
    ("megatron.core.fusions.fused_bias_gelu.bias_gelu_impl", False): {},
    ("megatron.core.transformer.utils.openai_gelu", False): {"openai_gelu": True},
    ("megatron.core.activations.quick_gelu", True): {"quick_geglu": True},
}

# Layer specs that build megatron-core's standard GPT layers (the builtin's local spec has the same
# weights and forward). Others (Gemma's, Llama-4's, Qwen3-Next's...) change the forward.
_GPT_LAYER_SPECS = {
    "megatron.bridge.models.gpt_provider.default_layer_spec",
    "megatron.bridge.models.gpt_provider.transformer_engine_layer_spec",
    "megatron.bridge.models.gpt_provider.transformer_engine_full_layer_spec",
    "megatron.bridge.models.gpt_provider.local_layer_spec",
    "megatron.core.models.gpt.gpt_layer_specs.get_gpt_decoder_block_spec",
    "megatron.core.models.gpt.gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec",
    "megatron.core.models.gpt.gpt_layer_specs.get_gpt_layer_local_spec",
}

# Provider classes whose `provide()` is GPTModelProvider's: they only set fields (checked in 0.1-0.3.1).
# Mamba and MLA providers are let through: their fields (hybrid_override_pattern,
# multi_latent_attention) make ModelArchitecture refuse them with the Export-Deploy hint.
_GPT_PROVIDERS = re.compile(
    r"^megatron\.bridge\.models\.("
    r"gpt_provider\.GPT(Model)?Provider\w*"
    r"|llama\.llama_provider\.(Code)?Llama(2|3|31|32)?ModelProvider\w*"
    r"|llama_nemotron\.llama_nemotron_provider\.Llama31Nemotron(Nano8B|70B)Provider"
    r"|qwen\.qwen_provider\.Qwen(2|25|3|3MoE)ModelProvider\w*"
    r"|mistral\.mistral_provider\.Mistral\w*ModelProvider\w*"
    r"|nemotron\.nemotron_provider\.Nemotron\w*ModelProvider\w*"
    r"|olmoe\.olmoe_provider\.OlMoEModelProvider\w*"
    r"|glm\.glm45_provider\.GLM(MoE|45|45Air)ModelProvider\w*"
    r"|mamba\.mamba_provider\.MambaModelProvider\w*"
    r"|nemotronh\.nemotron_h_provider\.Nemotron\w*Provider\w*"
    r"|deepseek\.deepseek_provider\.\w+"
    r"|kimi\.kimi_provider\.\w+"
    r")$"
)
_MAMBA_PROVIDERS = re.compile(r"^megatron\.bridge\.models\.(mamba|nemotronh)\.")

# TokenizerConfig field -> Megatron-LM arg (the same names, but for these).
_TOKENIZER_RENAMED = {"special_tokens": "tokenizer_special_tokens", "metadata_path": "tokenizer_metadata"}
# Where save_tokenizer_assets copies the files of a file-based tokenizer (arg -> file in iter_N/tokenizer/).
_TOKENIZER_COPIES = {
    "BertWordPieceLowerCase": {"vocab_file": "vocab.txt"},
    "BertWordPieceCase": {"vocab_file": "vocab.txt"},
    "GPT2BPETokenizer": {"vocab_file": "vocab.json", "merge_file": "merges.txt"},
    "SentencePieceTokenizer": {"tokenizer_model": "tokenizer.model"},
    "GPTSentencePieceTokenizer": {"tokenizer_model": "tokenizer.model"},
    "Llama2Tokenizer": {"tokenizer_model": "tokenizer.model"},
    "TikTokenizer": {"tokenizer_model": "tokenizer.json"},
}


def is_bridge_checkpoint(iter_dir: str | Path) -> bool:
    """Whether the iteration directory was written by Megatron-Bridge (it has run_config.yaml)."""
    return (Path(iter_dir) / CONFIG_FILE).is_file()


def read_run_config(iter_dir: str | Path) -> dict[str, Any]:
    """The parsed run_config.yaml of an iteration directory; DeploymentError if unreadable."""
    import yaml

    path = Path(iter_dir) / CONFIG_FILE
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DeploymentError(f"{path} cannot be read: {exc}") from None
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise DeploymentError(
            f"{path} has no `model:` section, so the model's architecture is unknown.",
            hint="Megatron-Bridge writes the model provider there (ConfigContainer.to_yaml).",
        )
    return config


def read_train_state_step(tracker: str | Path) -> int:
    """The `step` in a Megatron-Bridge train-state file (latest_train_state.pt), read without torch."""
    from ckpteval.checkpoint.torchfiles import read_torch_save

    path = Path(tracker)
    state = read_torch_save(path)
    try:
        step = state["step"]
        return int(step if isinstance(step, int) else step.item())
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise DeploymentError(f"{path} (Megatron-Bridge's train state) cannot be read: {exc}") from None


def hf_model_id(path: str | Path) -> str | None:
    """The Hugging Face model id or path a Bridge run started from (`model.hf_model_id`), if recorded.

    `path` is a checkpoint root or an iteration directory; like Bridge's
    get_hf_model_id_from_checkpoint, a root is read from its newest iter_* directory.
    """
    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        iters = sorted(
            (int(m.group(1)), p) for p in path.glob("iter_*") if (m := re.match(r"^iter_(\d+)$", p.name)) and p.is_dir()
        )
        if not iters or not (iters[-1][1] / CONFIG_FILE).is_file():
            return None
        path = iters[-1][1]
    value = read_run_config(path)["model"].get("hf_model_id")
    return str(value) if value else None


def bridge_args(iter_dir: str | Path) -> argparse.Namespace:
    """The model and tokenizer of a Bridge iteration directory, as a Megatron-LM args namespace.

    Raises DeploymentError for a provider or setting that cannot be expressed in Megatron-LM's
    names (a model whose provider builds something other than megatron-core's GPT layers).
    """
    iter_dir = Path(iter_dir)
    config = read_run_config(iter_dir)
    where = str(iter_dir / CONFIG_FILE)
    values = _model_args(config["model"], where)
    tokenizer = config.get("tokenizer")
    if isinstance(tokenizer, dict):
        values.update(_tokenizer_args(tokenizer, iter_dir / TOKENIZER_DIR))
    return argparse.Namespace(**values)


def _target(value: Any) -> str | None:
    return value.get("_target_") if isinstance(value, dict) else None


def _model_args(model: dict[str, Any], where: str) -> dict[str, Any]:
    provider = str(model.get("_target_", ""))
    if not _GPT_PROVIDERS.match(provider):
        raise DeploymentError(
            f"{where}: the model provider {provider or '(none)'} builds a model the builtin server does not "
            "reproduce (its provide() or layer spec differs from megatron-core's GPT model).",
            hint="Serve it with deployment.backend=export-deploy, which builds the model with Megatron-Bridge.",
        )
    spec = _target(model.get("transformer_layer_spec")) or model.get("transformer_layer_spec")
    if spec is not None and spec not in _GPT_LAYER_SPECS and not _MAMBA_PROVIDERS.match(provider):
        raise DeploymentError(
            f"{where}: model.transformer_layer_spec is {spec}, not one of megatron-core's GPT layer specs, "
            "so the builtin server cannot build the same layers.",
            hint="Serve it with deployment.backend=export-deploy.",
        )

    args: dict[str, Any] = {}
    for name, value in model.items():
        if name in _SPECIAL:
            continue
        if isinstance(value, dict) and "_target_" in value:
            # functions, enums, runtime objects: only their target is kept (e.g. init_method)
            value = value["_target_"] if not value.get("_call_") else value.get("_args_", [value["_target_"]])[0]
        args[_RENAMED.get(name, name)] = value

    heads = model.get("num_attention_heads")
    groups = model.get("num_query_groups")
    args["num_query_groups"] = groups if groups is not None else heads
    args["group_query_attention"] = groups is not None and groups != heads
    args["untie_embeddings_and_output_weights"] = not model.get("share_embeddings_and_output_weights", True)
    seq_length = model.get("seq_length")
    if seq_length is not None:
        args["max_position_embeddings"] = seq_length
    args["use_rotary_position_embeddings"] = model.get("position_embedding_type") == "rope"

    activation = _target(model.get("activation_func")) or "torch.nn.functional.gelu"
    gated = bool(model.get("gated_linear_unit", False))
    flags = _ACTIVATIONS.get((activation, gated))
    if flags is None:
        raise DeploymentError(
            f"{where}: activation_func={activation} with gated_linear_unit={gated} has no Megatron-LM "
            "equivalent (it has --swiglu, --squared-relu, --openai-gelu, --quick-geglu and GELU).",
            hint="Serve it with deployment.backend=export-deploy.",
        )
    args.update({"swiglu": False, "squared_relu": False, **flags})

    vocab = model.get("vocab_size")
    if vocab is not None:
        args["vocab_size"] = vocab
        padded = int(vocab)
        if model.get("should_pad_vocab", False):  # GPTModelProvider.provide(): calculate_padded_vocab_size
            multiple = int(model.get("make_vocab_size_divisible_by") or 1) * int(
                model.get("tensor_model_parallel_size") or 1
            )
            padded = -(-padded // multiple) * multiple
        args["padded_vocab_size"] = padded

    dtype = _target(model.get("params_dtype")) or ""
    args["bf16"] = bool(model.get("bf16")) or dtype == "torch.bfloat16"
    args["fp16"] = bool(model.get("fp16")) or dtype == "torch.float16"

    if _MAMBA_PROVIDERS.match(provider):
        # Hybrid Mamba: Megatron-LM's name for the layer pattern, which ModelArchitecture refuses.
        args["hybrid_override_pattern"] = model.get("hybrid_override_pattern") or "M"
        args["is_hybrid_model"] = True
    args["bridge_provider"] = provider
    return args


def _tokenizer_args(tokenizer: dict[str, Any], copies: Path) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for name, value in tokenizer.items():
        if name == "_target_":
            continue
        if name == "vocab_size" and value is None:  # set for NullTokenizer/TikTokenizer only; else the model's
            continue
        args[_TOKENIZER_RENAMED.get(name, name)] = value
    # The recorded paths are the training machine's; Bridge (since v0.2.0) copies the files into
    # iter_N/tokenizer/ under fixed names. Prefer the copy where the recorded file is not here.
    for arg, filename in _TOKENIZER_COPIES.get(str(args.get("tokenizer_type")), {}).items():
        recorded = args.get(arg)
        if (copies / filename).is_file() and not (isinstance(recorded, str) and Path(recorded).is_file()):
            args[arg] = str(copies / filename)
    # A Hugging Face tokenizer saved by path (not hub id) on the training machine: use the copy.
    model = args.get("tokenizer_model")
    if (
        args.get("tokenizer_type") == "HuggingFaceTokenizer"
        and isinstance(model, str)
        and Path(model).is_absolute()
        and not Path(model).exists()
        and (copies / "tokenizer_config.json").is_file()
    ):
        args["tokenizer_model"] = str(copies)
    return args
