"""Tensors a checkpoint holds that the model its args build does not have, and the arg that probably went missing.

megatron-core loads a checkpoint into the model the args build and, asked to, leaves the checkpoint's other
tensors where they are: a Qwen-style checkpoint whose args lost `qk_layernorm` and `add_qkv_bias` loads
without its query/key norms and QKV bias, and scores as another model. So such tensors refuse the run: before
submission, from the tensor index (names only, no weights: `unexpected_in_index`, for the optional tensors
this module knows), and in the builtin server, exactly (every tensor of the checkpoint against the built
model's). `deployment.ignore_unexpected_tensors=true` serves it as it is (recorded in results.json).
stdlib only: it runs in the dry run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ckpteval.errors import DeploymentError

IGNORE_SETTING = "deployment.ignore_unexpected_tensors"
ALLOW = f"{IGNORE_SETTING}=true"
SERVER_ALLOW = f"{ALLOW} (`evaluate deploy`: --ignore-unexpected-tensors)"
# state saved beside the model's that no model has: optimizer, RNG and rerun state, Transformer Engine's extras
NOT_MODEL = ("optimizer", "rng_state", "rerun_state", "_extra_state")
_SHOWN = 4  # tensors named per arg


@dataclass(frozen=True)
class _Optional:
    """Tensors that only some args build: a name pattern, the arg that builds them, and whether these args do."""

    pattern: re.Pattern[str]
    arg: str  # the Megatron-LM arg (and the value) that would build them
    built: Callable[[dict[str, Any]], bool]  # by the architecture (ModelArchitecture's fields)


def _layer_beyond(key: str, a: dict[str, Any]) -> bool:
    match = re.match(r"decoder\.layers\.(\d+)\.", key)
    return match is not None and int(match.group(1)) >= a["num_layers"]


def _linear_bias(a: dict[str, Any]) -> bool:
    return bool(a.get("add_bias_linear", True))


_OPTIONAL: tuple[_Optional, ...] = (
    _Optional(re.compile(r"self_attention\.(q|k)_layernorm\.weight$"), "qk_layernorm=True",
              lambda a: a["qk_layernorm"]),
    _Optional(
        re.compile(r"self_attention\.linear_qkv\.bias$"),
        "add_qkv_bias=True",
        lambda a: a["add_qkv_bias"] or _linear_bias(a),
    ),
    _Optional(re.compile(r"\.(linear_proj|linear_fc1|linear_fc2)\.bias$"), "add_bias_linear=True", _linear_bias),
    _Optional(re.compile(r"(layernorm\.bias|layer_norm_bias)$"), "normalization=LayerNorm",
              lambda a: a["normalization"] == "LayerNorm"),
    _Optional(
        re.compile(r"^output_layer\.weight$"),
        "untie_embeddings_and_output_weights=True",
        lambda a: a["untie_embeddings_and_output_weights"],
    ),
    _Optional(
        re.compile(r"^embedding\.position_embeddings\.weight$"),
        "position_embedding_type=learned_absolute",
        lambda a: a["position_embedding_type"] == "learned_absolute",
    ),
    _Optional(re.compile(r"\.mlp\.shared_experts\.gate_weight$"), "moe_shared_expert_gate=True",
              lambda a: a.get("moe_shared_expert_gate", False)),
    _Optional(re.compile(r"\.mlp\.shared_experts\."), "moe_shared_expert_intermediate_size",
              lambda a: bool(a.get("moe_shared_expert_intermediate_size"))),
    _Optional(re.compile(r"\.mlp\.router\.expert_bias$"), "moe_router_enable_expert_bias=True",
              lambda a: a.get("moe_router_enable_expert_bias", False)),
    _Optional(re.compile(r"\.mlp\.(router|experts)\."), "num_experts", lambda a: bool(a.get("num_experts"))),
    _Optional(re.compile(r"core_attention\.softmax_offset$"), "softmax_type=learnable",
              lambda a: a.get("softmax_type") == "learnable"),
    _Optional(re.compile(r"^mtp\."), "mtp_num_layers", lambda a: False),  # the builtin builds no MTP layers
)  # fmt: skip


@dataclass(frozen=True)
class UnexpectedTensors:
    """Tensors of the checkpoint the args' model does not have, with the arg that would build them (empty
    when no arg ckpteval knows does)."""

    arg: str
    tensors: tuple[str, ...]

    def __str__(self) -> str:
        shown = ", ".join(self.tensors[:_SHOWN])
        more = f" and {len(self.tensors) - _SHOWN} more" if len(self.tensors) > _SHOWN else ""
        why = f"built with {self.arg}, which the args lack" if self.arg else "no arg ckpteval knows builds them"
        return f"{shown}{more} ({why})"


def is_model_tensor(key: str) -> bool:
    """Whether a tensor index key is the model's (not optimizer, RNG or rerun state, nor an _extra_state)."""
    return not any(part in key for part in NOT_MODEL)


def unexpected_in_index(architecture: dict[str, Any], names: Iterable[str]) -> tuple[UnexpectedTensors, ...]:
    """The tensors among `names` (a checkpoint's tensor index) that only args these lack would build, by arg:
    the optional tensors this module knows (q/k norms, biases, the output layer, experts, layers past
    num_layers, ...). Tensors it does not know are left to the server's exact check."""
    found: dict[str, list[str]] = {}
    for name in sorted(names):
        if not is_model_tensor(name):
            continue
        if _layer_beyond(name, architecture):
            found.setdefault(f"num_layers > {architecture['num_layers']}", []).append(name)
            continue
        for optional in _OPTIONAL:
            if optional.pattern.search(name):
                if not optional.built(architecture):
                    found.setdefault(optional.arg, []).append(name)
                break
    return tuple(UnexpectedTensors(arg, tuple(tensors)) for arg, tensors in found.items())


def explain(architecture: dict[str, Any], names: Iterable[str]) -> tuple[UnexpectedTensors, ...]:
    """`names` (tensors the server found in the checkpoint and not in the model) grouped by the arg that
    probably went missing; those no known arg builds come last, under an empty arg."""
    names = sorted(names)
    known = unexpected_in_index(architecture, names)
    explained = {t for group in known for t in group.tensors}
    rest = tuple(n for n in names if n not in explained)
    return known + ((UnexpectedTensors("", rest),) if rest else ())


def refuse_unexpected(groups: tuple[UnexpectedTensors, ...], where: str, *, allow: str = ALLOW) -> None:
    """The one DeploymentError of a checkpoint holding tensors its args' model does not have; `allow`: how to
    serve it anyway."""
    if not groups:
        return
    count = sum(len(g.tensors) for g in groups)
    args = [g.arg for g in groups if g.arg]
    raise DeploymentError(
        f"{where} holds {count} tensor(s) that the model its args build does not have, so they would not be "
        f"loaded and the model served would not be the one saved: {'; '.join(str(g) for g in groups)}.",
        hint=(f"Set {', '.join(args)} in the checkpoint's args (convert or save it again with them), " if args else "")
        + f"or serve it without those tensors with {allow} (recorded in results.json).",
    )
