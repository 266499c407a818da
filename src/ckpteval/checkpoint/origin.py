"""The Hugging Face model a checkpoint came from, compared with the checkpoint's own args before anything runs.

A converted checkpoint can hold the Hugging Face model's weights bit for bit and still be served as another
model: Megatron-LM's `tools/checkpoint/convert.py` (llama_mistral loader) never reads `rope_theta`, so its
args say `rotary_base=10000` for a model trained with 100000, and the server computes what the args say.
Where the origin is known, its `config.json` holds the truth; `compare_with_origin` lists every number that
defines the forward pass on which the two disagree, and a run is refused on any of them (before any side
effect) unless the user says `deployment.ignore_origin_mismatch=true`.

The origin is, first to last: `deployment.origin` (a Hugging Face model directory or a hub id in the local
cache), `deployment.tokenizer` when it names a directory (or cached hub id) with a `config.json` (a user who
converted a model usually points the tokenizer at the model it came from), Megatron-Bridge's `hf_model_id`
(when it is a directory here or in the local cache). stdlib only: it runs in the dry run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.errors import DeploymentError

CONFIG_FILE = "config.json"
ORIGIN_SETTING = "deployment.origin"
IGNORE_SETTING = "deployment.ignore_origin_mismatch"
# Megatron-LM pads the vocabulary to a multiple of make_vocab_size_divisible_by (128) x TP: at most 16 x 128
_MAX_VOCAB_PADDING = 128 * 16


@dataclass(frozen=True)
class Disagreement:
    """One forward-pass number on which the checkpoint's args and its origin's config.json differ."""

    setting: str  # the Megatron-LM arg
    checkpoint: Any
    origin_key: str  # the Hugging Face config key
    origin: Any

    def __str__(self) -> str:
        mine, theirs = _show(self.checkpoint), _show(self.origin)
        return f"{self.setting}={mine} in the checkpoint, {self.origin_key}={theirs} in it"


@dataclass(frozen=True)
class OriginCheck:
    """The checkpoint compared with the model it came from."""

    origin: str  # what names it: "deployment.origin=/models/x", "Megatron-Bridge's hf_model_id meta/x", ...
    config: str  # the config.json read
    compared: tuple[str, ...]  # the Megatron-LM settings compared
    disagreements: tuple[Disagreement, ...] = ()


def forward_numbers(architecture: dict[str, Any]) -> dict[str, Any]:
    """The numbers that define a model's forward pass, defaults included, under Megatron-LM's names (what
    `evaluate inspect` shows and what is compared with the origin); `architecture` is a ModelArchitecture's
    fields."""
    a = architecture
    rope = a["position_embedding_type"] == "rope"
    numbers: dict[str, Any] = {
        "num_layers": a["num_layers"],
        "hidden_size": a["hidden_size"],
        "ffn_hidden_size": a["ffn_hidden_size"],
        "num_attention_heads": a["num_attention_heads"],
        "num_query_groups": a["num_query_groups"],
        "kv_channels": a["kv_channels"],
        "padded_vocab_size": a["padded_vocab_size"],
        "position_embedding_type": a["position_embedding_type"],
        "rotary_base": a["rotary_base"] if rope else None,
        "rotary_percent": a["rotary_percent"] if rope else None,
        "rope_scaling": _megatron_rope_scaling(a) if rope else None,
        "normalization": a["normalization"],
        "norm_epsilon": a["norm_epsilon"],
        "tied_embeddings": not a["untie_embeddings_and_output_weights"],
        "add_qkv_bias": a["add_qkv_bias"],
    }
    if a.get("num_experts"):
        numbers.update(num_experts=a["num_experts"], moe_router_topk=a["moe_router_topk"])
        numbers["moe_ffn_hidden_size"] = a["moe_ffn_hidden_size"]
    return numbers


def _megatron_rope_scaling(a: dict[str, Any]) -> str:
    if a.get("use_rope_scaling"):
        return f"llama3 x{_show(float(a['rope_scaling_factor']))}"
    if a.get("rotary_seq_len_interpolation_factor"):
        return f"linear x{_show(float(a['rotary_seq_len_interpolation_factor']))}"
    return "none"


def _hf_rope_scaling(config: dict[str, Any]) -> str:
    scaling = config.get("rope_scaling")
    if not scaling:
        return "none"
    kind = scaling.get("rope_type") or scaling.get("type") or "?"
    if kind == "default":
        return "none"
    factor = scaling.get("factor")
    return f"{kind} x{_show(float(factor))}" if isinstance(factor, (int, float)) else str(kind)


# Megatron-LM setting -> (Hugging Face keys, first found wins), compared where config.json has one of them
_KEYS: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd"),
    "ffn_hidden_size": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_query_groups": ("num_key_value_heads",),
    "kv_channels": ("head_dim",),
    "padded_vocab_size": ("vocab_size",),
    "rotary_base": ("rope_theta",),
    "rotary_percent": ("partial_rotary_factor",),
    "norm_epsilon": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"),
    "tied_embeddings": ("tie_word_embeddings",),
    "add_qkv_bias": ("attention_bias",),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "moe_router_topk": ("num_experts_per_tok",),
    "moe_ffn_hidden_size": ("moe_intermediate_size",),
}


def compare_with_origin(architecture: dict[str, Any], config: dict[str, Any]) -> tuple[list[str], list[Disagreement]]:
    """(the settings compared, those that disagree) between a checkpoint's architecture (ModelArchitecture's
    fields) and a Hugging Face config.json. A key config.json lacks is not compared (Hugging Face's defaults
    differ by model type); the RoPE scaling is compared whenever the model uses RoPE (no `rope_scaling`: none)."""
    config = config.get("text_config") or config  # a multimodal model's language model
    numbers = forward_numbers(architecture)
    compared: list[str] = []
    disagreements: list[Disagreement] = []
    for setting, keys in _KEYS.items():
        key = next((k for k in keys if config.get(k) is not None), None)
        if key is None or numbers.get(setting) is None:
            continue
        compared.append(setting)
        mine, theirs = numbers[setting], config[key]
        if not _agree(setting, mine, theirs):
            disagreements.append(Disagreement(setting, mine, key, theirs))
    if numbers["rope_scaling"] is not None:
        compared.append("rope_scaling")
        theirs = _hf_rope_scaling(config)
        if numbers["rope_scaling"] != theirs:
            disagreements.append(Disagreement("rope_scaling", numbers["rope_scaling"], "rope_scaling", theirs))
    return compared, disagreements


def _agree(setting: str, mine: Any, theirs: Any) -> bool:
    if isinstance(mine, bool) or isinstance(theirs, bool):
        return bool(mine) == bool(theirs)
    if not isinstance(theirs, (int, float)):
        return False
    if setting == "padded_vocab_size":  # Megatron-LM pads the vocabulary; never below the model's
        return theirs <= mine < theirs + _MAX_VOCAB_PADDING
    return math.isclose(float(mine), float(theirs), rel_tol=1e-6)


def find_origin(*, origin: str | None, tokenizer: str | None, hf_model_id: str | None) -> tuple[str, Path] | None:
    """(what names it, its config.json) of the model the checkpoint came from, or None when nothing names one
    that can be read here. `origin` (deployment.origin) must be found: DeploymentError when it is not."""
    if origin:
        config = _config_of(origin)
        if config is None:
            raise DeploymentError(
                f"{ORIGIN_SETTING}={origin} has no {CONFIG_FILE} (it is neither a Hugging Face model directory "
                "nor a hub id in the local Hugging Face cache).",
                hint=f"Point {ORIGIN_SETTING} at the Hugging Face model the checkpoint was converted from, "
                "or leave it unset.",
            )
        return f"{ORIGIN_SETTING}={origin}", config
    if tokenizer:
        config = _config_of(tokenizer)
        if config is not None:
            return f"deployment.tokenizer={tokenizer}", config
    if hf_model_id:
        config = _config_of(hf_model_id)
        if config is not None:
            return f"Megatron-Bridge's hf_model_id {hf_model_id}", config
    return None


def _config_of(name: str) -> Path | None:
    """The config.json of a Hugging Face model directory, a config.json itself, or a hub id's cached snapshot."""
    from ckpteval.checkpoint.tokenizer_source import hub_cache_dir

    path = Path(name).expanduser()
    if path.is_file() and path.name == CONFIG_FILE:
        return path
    if (path / CONFIG_FILE).is_file():
        return path / CONFIG_FILE
    if name.startswith(("/", ".", "~")) or name.count("/") != 1:
        return None
    repo = hub_cache_dir() / ("models--" + name.replace("/", "--"))
    ref = repo / "refs" / "main"
    snapshot = repo / "snapshots" / (ref.read_text().strip() if ref.is_file() else "main")
    return snapshot / CONFIG_FILE if (snapshot / CONFIG_FILE).is_file() else None


def check_origin(architecture: dict[str, Any], named_by: str, config_path: Path) -> OriginCheck:
    """Compare the architecture with the config.json at `config_path` (named by `named_by`)."""
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DeploymentError(f"{config_path} ({named_by}) cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise DeploymentError(f"{config_path} ({named_by}) does not hold a JSON object.")
    compared, disagreements = compare_with_origin(architecture, config)
    return OriginCheck(
        origin=named_by, config=str(config_path), compared=tuple(compared), disagreements=tuple(disagreements)
    )


def refuse_mismatch(check: OriginCheck, where: str) -> None:
    """The one DeploymentError of a checkpoint whose args disagree with its origin."""
    if not check.disagreements:
        return
    listed = "; ".join(str(d) for d in check.disagreements)
    lent = ""
    if check.origin.startswith("deployment.tokenizer="):
        lent = (
            f" ({check.origin} is taken for the model the checkpoint came from because it holds a {CONFIG_FILE}; "
            f"if it only lends its tokenizer, say so with {IGNORE_SETTING}=true.)"
        )
    raise DeploymentError(
        f"{where} disagrees with the model it came from ({check.origin}, {check.config}): {listed}. "
        "The server computes what the checkpoint's args say, so its scores would not be that model's.",
        hint="Fix the checkpoint's args (e.g. convert it again with the right settings), name the right origin "
        f"with {ORIGIN_SETTING}=DIR, or serve it as it is with {IGNORE_SETTING}=true (recorded in results.json)."
        + lent,
    )


def _show(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)
