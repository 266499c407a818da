"""The Hugging Face model a checkpoint came from, compared with the checkpoint's own args before anything runs.

A converted checkpoint can hold the Hugging Face model's weights bit for bit and still be served as another
model: Megatron-LM's `tools/checkpoint/convert.py` (llama_mistral loader) never reads `rope_theta`, so its
args say `rotary_base=10000` for a model trained with 100000, and the server computes what the args say.
Where the origin is known, its `config.json` holds the truth; `compare_with_origin` lists every number that
defines the forward pass on which the two disagree, and a run is refused on any of them (before any side
effect) unless the user says `deployment.ignore_origin_mismatch=true`. config.json is read in transformers 4's
and 5's formats (`checkpoint.hf_config`); a setting it does not say is listed as not compared, never as agreeing.

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

from ckpteval.checkpoint.hf_config import MEGATRON_LLAMA3, origin_settings
from ckpteval.errors import DeploymentError

CONFIG_FILE = "config.json"
ORIGIN_SETTING = "deployment.origin"
IGNORE_SETTING = "deployment.ignore_origin_mismatch"
# Megatron-LM pads the vocabulary to a multiple of make_vocab_size_divisible_by (128) x TP: at most 16 x 128
_MAX_VOCAB_PADDING = 128 * 16


@dataclass(frozen=True)
class Disagreement:
    """One forward-pass number on which the checkpoint's args and its origin's config.json differ."""

    setting: str  # the Megatron-LM arg, or a name for what several args set (see ARGS_OF)
    checkpoint: Any
    origin_key: str  # the Hugging Face config key, or "model_type=..." where the model type fixes it
    origin: Any

    def __str__(self) -> str:
        mine, theirs = show_value(self.checkpoint), show_value(self.origin)
        args = f" (args {ARGS_OF[self.setting]})" if self.setting in ARGS_OF else ""
        if self.origin_key.startswith("model_type="):
            return f"{self.setting}={mine} in the checkpoint{args}, {theirs} in it ({self.origin_key})"
        return f"{self.setting}={mine} in the checkpoint{args}, {self.origin_key}={theirs} in it"


# the Megatron-LM args behind a compared setting that is not itself an arg
ARGS_OF = {
    "rope_type": "use_rope_scaling, rotary_seq_len_interpolation_factor",
    "rope_scaling.factor": "rope_scaling_factor or rotary_seq_len_interpolation_factor",
    "rope_scaling.low_freq_factor": "none: megatron-core fixes 1",
    "rope_scaling.high_freq_factor": "none: megatron-core fixes 4",
    "rope_scaling.original_max_position_embeddings": "none: megatron-core fixes 8192",
    "activation": "swiglu, squared_relu, quick_geglu",
    "qk_norm": "qk_layernorm, qk_l2_norm",
    "qkv_bias": "add_qkv_bias, add_bias_linear",
    "window_layers": "window_attn_skip_freq",
    "tied_embeddings": "untie_embeddings_and_output_weights",
    "moe_topk_renormalized": "moe_router_pre_softmax",
}


@dataclass(frozen=True)
class OriginCheck:
    """The checkpoint compared with the model it came from."""

    origin: str  # what names it: "deployment.origin=/models/x", "Megatron-Bridge's hf_model_id meta/x", ...
    config: str  # the config.json read
    compared: tuple[str, ...]  # the Megatron-LM settings compared
    disagreements: tuple[Disagreement, ...] = ()
    not_compared: tuple[str, ...] = ()  # "setting (why)": what config.json does not say, or says unreadably


def forward_numbers(architecture: dict[str, Any]) -> dict[str, Any]:
    """The numbers that define a model's forward pass, defaults included, under Megatron-LM's names (what
    `evaluate inspect` shows and what is compared with the origin; None: not used by this model);
    `architecture` is a ModelArchitecture's fields."""
    a = architecture
    rope = a["position_embedding_type"] == "rope"
    window = a.get("window_size")
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
        **(_megatron_rope_scaling(a) if rope else {}),
        "normalization": a["normalization"],
        "apply_layernorm_1p": bool(a.get("apply_layernorm_1p")),
        "norm_epsilon": a["norm_epsilon"],
        "activation": _megatron_activation(a),
        "qk_norm": "l2" if a.get("qk_l2_norm") else "learned" if a.get("qk_layernorm") else "none",
        "qkv_bias": bool(a["add_qkv_bias"] or a.get("add_bias_linear", True)),
        "add_bias_linear": bool(a.get("add_bias_linear", True)),
        "window_size": window[0] + 1 if window else "none",  # Hugging Face's sliding_window: left + 1
        "window_layers": _window_layers(a) if window else None,
        "tied_embeddings": not a["untie_embeddings_and_output_weights"],
    }
    if a.get("num_experts"):
        softmax = a.get("moe_router_score_function", "softmax") == "softmax"
        numbers.update(
            num_experts=a["num_experts"],
            moe_router_topk=a["moe_router_topk"],
            moe_ffn_hidden_size=a["moe_ffn_hidden_size"],
            moe_shared_expert_intermediate_size=a.get("moe_shared_expert_intermediate_size") or "none",
            # softmax over the top-k logits renormalises them; pre-softmax picks from every expert's probability
            moe_topk_renormalized=not a.get("moe_router_pre_softmax") if softmax else a["moe_router_topk"] > 1,
            moe_router_score_function=a.get("moe_router_score_function", "softmax"),
        )
    return numbers


def _megatron_rope_scaling(a: dict[str, Any]) -> dict[str, Any]:
    if a.get("use_rope_scaling"):
        factors = {f"rope_scaling.{k}": v for k, v in MEGATRON_LLAMA3.items()}
        return {"rope_type": "llama3", "rope_scaling.factor": float(a["rope_scaling_factor"]), **factors}
    if a.get("rotary_seq_len_interpolation_factor"):
        return {"rope_type": "linear", "rope_scaling.factor": float(a["rotary_seq_len_interpolation_factor"])}
    return {"rope_type": "default"}


def _megatron_activation(a: dict[str, Any]) -> str:
    if a.get("swiglu"):
        return "silu"
    if a.get("squared_relu"):
        return "relu2"
    return "quick-gelu" if a.get("quick_geglu") else "gelu"


def _window_layers(a: dict[str, Any]) -> tuple[bool, ...]:
    """Per layer, whether it attends through the window (megatron-core's is_layer_window_attention)."""
    skip = a.get("window_attn_skip_freq")
    if skip is None:
        return (True,) * a["num_layers"]
    if isinstance(skip, int):
        return tuple((n + 1) % skip != 0 for n in range(a["num_layers"]))
    return tuple(bool(v) for v in skip)


def compare_with_origin(
    architecture: dict[str, Any], config: dict[str, Any]
) -> tuple[list[str], list[Disagreement], list[str]]:
    """(the settings compared, those that disagree, those not compared with why) between a checkpoint's
    architecture (ModelArchitecture's fields) and a Hugging Face config.json (transformers 4 or 5 format).

    A setting is compared only where both sides say it: a key config.json lacks (and its model type does not
    fix) is listed as not compared, never taken for a default (Hugging Face's defaults differ by model type).
    The RoPE scaling's factors are compared where both sides use the same scaling type."""
    said, unreadable = origin_settings(config)
    numbers = forward_numbers(architecture)
    compared: list[str] = []
    disagreements: list[Disagreement] = []
    not_compared: list[str] = []
    rope_types_agree = "rope_type" in said and numbers.get("rope_type") == said["rope_type"].value
    for setting, mine in numbers.items():
        if mine is None:
            continue
        if setting.startswith("rope_scaling.") and not rope_types_agree:
            continue  # the type's disagreement (or not being compared) says it
        if setting not in said:
            why = unreadable.get(setting, "config.json does not say")
            not_compared.append(f"{setting} ({why})")
            continue
        compared.append(setting)
        theirs = said[setting]
        if not _agree(setting, mine, theirs.value):
            disagreements.append(Disagreement(setting, mine, theirs.key, theirs.value))
    not_compared += [f"{key} ({why})" for key, why in unreadable.items() if key not in numbers]
    return compared, disagreements, not_compared


def _agree(setting: str, mine: Any, theirs: Any) -> bool:
    if isinstance(mine, bool) or isinstance(theirs, bool):
        return isinstance(mine, bool) and isinstance(theirs, bool) and mine == theirs
    if isinstance(mine, str) or isinstance(theirs, str) or isinstance(mine, tuple) or isinstance(theirs, tuple):
        return mine == theirs
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
    compared, disagreements, not_compared = compare_with_origin(architecture, config)
    return OriginCheck(
        origin=named_by,
        config=str(config_path),
        compared=tuple(compared),
        disagreements=tuple(disagreements),
        not_compared=tuple(not_compared),
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


def show_value(value: Any) -> str:
    """A setting's value for people: 8.0 as 8, a per-layer pattern as the layers it is on."""
    if isinstance(value, tuple) and all(isinstance(v, bool) for v in value):  # per layer: the windowed ones
        return "layers " + ",".join(str(n + 1) for n, on in enumerate(value) if on) if any(value) else "no layer"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)
