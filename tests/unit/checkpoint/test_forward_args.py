"""The table of forward-changing Megatron-LM args: complete for the installed megatron-core, and enforced.

Served args are checked by building the tiny model with and without the arg from the same weights
(weights the base model lacks get random values): the forward must differ. Refused args must end in
one DeploymentError that names the arg and the Export-Deploy configuration that serves it.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from ckpteval.checkpoint.architecture import ModelArchitecture
from ckpteval.checkpoint.forward_args import FORWARD_ARGS, NO_FORWARD_FIELDS, config_fields_covered
from ckpteval.errors import DeploymentError

BASE: dict[str, Any] = dict(
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    group_query_attention=True,
    num_query_groups=2,
    kv_channels=16,
    ffn_hidden_size=96,
    padded_vocab_size=128,
    max_position_embeddings=64,
    position_embedding_type="rope",
    normalization="RMSNorm",
    add_bias_linear=False,
)
MOE: dict[str, Any] = dict(num_experts=4, moe_ffn_hidden_size=32, moe_router_topk=2)

# arg -> (its probe value, or several args to set together; what the base model needs for the arg to matter)
SERVED_PROBES: dict[str, tuple[Any, dict[str, Any]]] = {
    "num_layers": (4, {}),
    "hidden_size": (96, {}),
    "num_attention_heads": (8, {}),
    "group_query_attention": (False, {}),
    "num_query_groups": (1, {}),
    "kv_channels": (8, {}),
    "ffn_hidden_size": (128, {}),
    "padded_vocab_size": (136, {}),
    "max_position_embeddings": (32, {"position_embedding_type": "learned_absolute"}),
    "untie_embeddings_and_output_weights": (True, {}),
    "position_embedding_type": ("learned_absolute", {}),
    "use_rotary_position_embeddings": (True, {"position_embedding_type": None}),
    "add_position_embedding": (False, {"position_embedding_type": "learned_absolute"}),
    "rotary_base": (500, {}),
    "rotary_percent": (0.5, {}),
    "rotary_interleaved": (True, {}),
    "rotary_seq_len_interpolation_factor": (4, {}),
    "use_rope_scaling": (True, {"rotary_base": 1000000}),
    "rope_scaling_factor": (32.0, {"use_rope_scaling": True, "rotary_base": 1000000}),
    "no_rope_freq": (2, {}),
    "normalization": ("LayerNorm", {}),
    "norm_epsilon": (0.5, {}),
    "layernorm_epsilon": (0.5, {}),
    "apply_layernorm_1p": (True, {"normalization": "LayerNorm"}),
    "layernorm_zero_centered_gamma": (True, {"normalization": "LayerNorm"}),
    "qk_layernorm": (True, {}),
    "qk_l2_norm": (True, {}),
    "swiglu": (True, {}),
    "squared_relu": (True, {}),
    "quick_geglu": (True, {}),
    "glu_linear_offset": (1.0, {"swiglu": True}),
    "activation_func_clamp_value": (0.05, {"swiglu": True}),
    "add_bias_linear": (True, {}),
    "disable_bias_linear": (True, {"add_bias_linear": None}),
    "add_qkv_bias": (True, {}),
    "softmax_scale": (0.5, {}),
    "softmax_type": ("off-by-one", {}),
    "window_size": ((2, 0), {}),
    "window_attn_skip_freq": (2, {"window_size": (2, 0)}),
    "num_experts": (4, {}),
    "moe_ffn_hidden_size": (48, MOE),
    "moe_router_topk": (1, {**MOE, "moe_router_pre_softmax": True}),
    "moe_router_score_function": ("sigmoid", MOE),
    "moe_router_pre_softmax": (True, MOE),
    "moe_router_topk_scaling_factor": (3.0, MOE),
    "moe_router_enable_expert_bias": (True, {**MOE, "moe_router_score_function": "sigmoid"}),
    "moe_router_num_groups": ({"moe_router_num_groups": 2, "moe_router_group_topk": 1}, MOE),
    "moe_router_group_topk": (1, {**MOE, "moe_router_num_groups": 2}),
    "moe_router_load_balancing_type": ("sinkhorn", MOE),
    "moe_shared_expert_intermediate_size": (32, MOE),
    "moe_shared_expert_gate": (True, {**MOE, "moe_shared_expert_intermediate_size": 32}),
    "moe_layer_freq": ([1, 0], MOE),
    "moe_apply_probs_on_input": (True, {**MOE, "moe_router_topk": 1, "moe_router_pre_softmax": True}),
}
REFUSED_PROBES: dict[str, Any] = {
    "rope_type": "yarn",
    "mrope_section": [16, 24, 24],
    "hybrid_override_pattern": "M-M-",
    "hybrid_layer_pattern": "M*M*",
    "experimental_attention_variant": "gated_delta_net",
    "linear_attention_freq": 4,
    "moe_expert_capacity_factor": 1.0,
    "moe_latent_size": 16,
    "mtp_num_layers": 1,
    "heterogeneous_layers_config_path": "/runs/nas.json",
    "spec": ["megatron.core.models.gpt.gpt_layer_specs", "get_gpt_layer_local_spec"],
}


def test_every_transformer_config_field_is_classified() -> None:
    """Fails after a megatron-core upgrade that adds a field: classify it in forward_args.py."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    assert sorted(fields - config_fields_covered()) == []
    # and nothing stale: every classified field exists (args outside the config say so)
    assert sorted(config_fields_covered() - fields) == []


def test_classified_once() -> None:
    in_table = {f for name, e in FORWARD_ARGS.items() if e.in_config for f in (e.config_fields or (name,))}
    assert sorted(in_table & set(NO_FORWARD_FIELDS)) == []


def test_every_served_and_refused_arg_has_a_probe() -> None:
    served = {n for n, e in FORWARD_ARGS.items() if e.status == "served"}
    refused = {n for n, e in FORWARD_ARGS.items() if e.status == "refused"}
    assert served == set(SERVED_PROBES)
    assert refused - set(REFUSED_PROBES) <= {
        n for n in refused if FORWARD_ARGS[n].is_harmless(False) and not FORWARD_ARGS[n].is_harmless(True)
    }


@pytest.mark.parametrize("name", sorted(n for n, e in FORWARD_ARGS.items() if e.status == "refused"))
def test_refused_arg_is_named_with_what_serves_it(name: str) -> None:
    args = argparse.Namespace(**BASE, **{name: REFUSED_PROBES.get(name, True)})
    with pytest.raises(DeploymentError) as info:
        ModelArchitecture.from_args(args, where="ck")
    assert f"{name}=" in info.value.message
    assert FORWARD_ARGS[name].why.split(" (")[0].split(":")[0] in info.value.message
    assert info.value.hint and "deployment.backend=export-deploy" in info.value.hint


@pytest.mark.parametrize("name", ["hybrid_override_pattern", "is_hybrid_model"])
def test_hybrid_mamba_points_at_export_deploy_mamba(name: str) -> None:
    args = argparse.Namespace(**BASE, **{name: REFUSED_PROBES.get(name, True)})
    with pytest.raises(DeploymentError) as info:
        ModelArchitecture.from_args(args, where="ck")
    assert info.value.hint and "deployment.model_type=mamba" in info.value.hint


@pytest.mark.parametrize(
    "name", sorted(n for n, e in FORWARD_ARGS.items() if e.status == "refused" and None in e.harmless)
)
def test_refused_arg_at_its_default_is_accepted(name: str) -> None:
    ModelArchitecture.from_args(argparse.Namespace(**BASE, **{name: None}), where="ck")


@pytest.fixture(scope="module")
def runtime() -> None:
    from ckpteval.server.runtime import init_runtime

    init_runtime("cpu")


def _forward(args: argparse.Namespace, weights: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    import torch

    from ckpteval.server.model import build_gpt_model

    arch = ModelArchitecture.from_args(args, where="probe")
    torch.manual_seed(0)
    model = build_gpt_model(arch, initialize=True, init_std=0.2)
    state = model.state_dict()
    # the base model's weights where the shapes agree; random ones elsewhere (biases and norms too:
    # megatron initialises them to 0 and 1, under which some settings would be the identity)
    generator = torch.Generator().manual_seed(1 if weights is None else 2)  # new tensors != base ones
    for key, value in state.items():
        if not torch.is_tensor(value) or not value.is_floating_point():
            continue
        if weights is not None and key in weights and weights[key].shape == value.shape:
            value.copy_(weights[key])
        else:
            value.copy_(torch.randn(value.shape, generator=generator) * 0.2 + (1.0 if "norm" in key else 0.0))
    ids = torch.arange(12)[None] * 7 % 120
    mask = torch.triu(torch.ones(12, 12, dtype=torch.bool), diagonal=1)[None, None]
    with torch.inference_mode():
        out = model(input_ids=ids, position_ids=torch.arange(12)[None], attention_mask=mask)
    return out, state


@pytest.mark.parametrize("name", sorted(SERVED_PROBES))
def test_served_arg_changes_the_built_model(name: str, runtime: None) -> None:
    import torch

    probe, base_overrides = SERVED_PROBES[name]
    base = argparse.Namespace(**{**BASE, **base_overrides})
    if name == "layernorm_epsilon" or name == "norm_epsilon":
        base.norm_epsilon = base.layernorm_epsilon = None
    reference, weights = _forward(base, None)
    probed = argparse.Namespace(**{**vars(base), **(probe if isinstance(probe, dict) else {name: probe})})
    out, _ = _forward(probed, {k: v.clone() for k, v in weights.items() if torch.is_tensor(v)})
    assert out.shape != reference.shape or float((out - reference).abs().max()) > 1e-5, f"{name} was ignored"


def test_forward_settings_lists_what_a_checkpoint_sets() -> None:
    from ckpteval.checkpoint.forward_args import forward_settings

    args = argparse.Namespace(
        **BASE, window_size=(4095, 0), qk_l2_norm=False, rotary_base=10000, apply_query_key_layer_scaling=True
    )
    found = {name: (value, entry.status) for name, value, entry in forward_settings(args)}
    assert found["window_size"] == ((4095, 0), "served")
    assert found["apply_query_key_layer_scaling"] == (True, "no-effect")
    assert "qk_l2_norm" not in found and "rotary_base" not in found  # defaults say nothing
    assert found["num_layers"] == (2, "served")
