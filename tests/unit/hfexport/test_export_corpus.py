"""`export_checkpoint` + `check_parity` on real checkpoints megatron-core wrote, one per architecture.

Each corpus checkpoint was made from a transformers model (`hf_reference_dir`), so the export must give back
that model's tensors bit for bit, and transformers on the export must compute what the builtin engine computes
on the checkpoint (logits within the tolerance, greedy tokens identical). A wrong export (the checkpoint's RoPE
base edited after exporting, a tensor changed) is refused naming the field or tensor. The corpus is the one
tests/unit/server/test_parity_architectures.py builds (shared in a session).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ckpteval.errors import DeploymentError
from tests.support.corpus import built_once
from tests.support.corpus.architectures import NAMES, build_many, hf_reference_dir
from tests.support.corpus.edit import with_args

EXPORTED = NAMES


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return built_once(tmp_path_factory, "architectures", lambda root: build_many({n: root / n for n in NAMES}))


@pytest.fixture(scope="module")
def exports(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from ckpteval.hfexport.write import export_checkpoint

    root = tmp_path_factory.mktemp("exports")
    return {name: export_checkpoint(checkpoints[name], root / name) for name in EXPORTED}


def _tensors(directory: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(directory.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


@pytest.mark.parametrize("name", EXPORTED)
def test_the_export_gives_back_the_original_tensors_bit_for_bit(name: str, checkpoints, exports) -> None:
    import torch

    ours, original = _tensors(exports[name].output), _tensors(hf_reference_dir(checkpoints[name]))
    assert sorted(ours) == sorted(original)
    different = [k for k in ours if ours[k].dtype != original[k].dtype or not torch.equal(ours[k], original[k])]
    assert different == []


@pytest.mark.parametrize("name", EXPORTED)
def test_transformers_on_the_export_computes_what_the_checkpoint_computes(name: str, checkpoints, exports) -> None:
    from ckpteval.hfexport.parity import TOLERANCE, check_parity

    started = time.monotonic()
    report = check_parity(checkpoints[name], exports[name].output)
    print(f"{name}: logits max |diff| {report.max_abs_logit_diff:.2e} in {time.monotonic() - started:.1f} s")
    assert report.differences == []
    assert report.max_abs_logit_diff <= TOLERANCE
    assert report.greedy_identical and report.tensors_compared == exports[name].tensors
    assert {p.name for p in report.prompts} == {"chat", "plain", "long"}
    assert max(p.tokens for p in report.prompts) == 256 - 16  # the long prompt fills the 256-position context
    assert "rotary_base" in report.config_compared and "window_size" in report.config_compared


def test_the_config_reads_as_the_original_model_s(checkpoints, exports) -> None:
    from transformers import AutoConfig

    for name in EXPORTED:
        ours = AutoConfig.from_pretrained(str(exports[name].output))
        original = AutoConfig.from_pretrained(str(hf_reference_dir(checkpoints[name])))
        assert type(ours) is type(original), name
        for key in ("num_hidden_layers", "hidden_size", "num_key_value_heads", "head_dim", "vocab_size",
                    "tie_word_embeddings", "sliding_window", "rope_parameters", "num_experts_per_tok",
                    "intermediate_size_mlp", "use_qk_norm", "no_rope_layers", "moe_layers",
                    "attn_temperature_tuning"):  # fmt: skip
            assert getattr(ours, key, None) == getattr(original, key, None), (name, key)


def test_a_llama4_export_whose_no_rope_layers_were_edited_is_refused_naming_them(
    exports, checkpoints, tmp_path: Path
) -> None:
    import json
    import shutil

    from ckpteval.hfexport.parity import check_parity

    copy = tmp_path / "llama4"
    shutil.copytree(exports["llama4_no_rope"].output, copy)
    config = json.loads((copy / "config.json").read_text())
    assert config["no_rope_layers"] == [1, 0]
    config["no_rope_layers"] = [1, 1]  # the second layer rotates too
    (copy / "config.json").write_text(json.dumps(config))
    report = check_parity(checkpoints["llama4_no_rope"], copy)
    assert report.config_differences == ("no_rope_freq=(0, 1) in the checkpoint, no_rope_layers=[1, 1] in config.json",)
    assert report.max_abs_logit_diff > report.tolerance and not report.passed


def test_a_checkpoint_whose_rope_base_changed_since_the_export_is_refused_naming_it(
    checkpoints, exports, tmp_path: Path
) -> None:
    from ckpteval.hfexport.parity import check_parity

    edited = with_args(checkpoints["llama3"], tmp_path / "edited", rotary_base=10000.0)
    report = check_parity(edited, exports["llama3"].output)
    assert not report.passed
    # named in the config.json's own format (transformers 5: rope_parameters)
    assert report.config_differences == (
        "rotary_base=10000 in the checkpoint, rope_parameters.rope_theta=500000 in config.json",
    )
    assert report.tensor_differences == () and report.max_abs_logit_diff > report.tolerance
    with pytest.raises(
        DeploymentError, match=r"rotary_base=10000 in the checkpoint, rope_parameters\.rope_theta=500000"
    ) as caught:
        report.refuse()
    assert "logits: long prompt" in caught.value.message


def test_a_changed_tensor_is_named(checkpoints, exports, tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    from ckpteval.hfexport.parity import check_parity

    copy = tmp_path / "qwen2"
    shutil.copytree(exports["qwen2"].output, copy)
    tensors = load_file(str(copy / "model.safetensors"))
    tensors["model.layers.1.self_attn.k_proj.bias"][3] += 0.5
    save_file(tensors, str(copy / "model.safetensors"))
    report = check_parity(checkpoints["qwen2"], copy)
    assert report.tensor_differences == ("differ: model.layers.1.self_attn.k_proj.bias (max |diff| 0.5)",)
    assert report.config_differences == () and not report.passed


def test_a_second_export_of_the_same_checkpoint_writes_nothing(checkpoints, exports, tmp_path: Path) -> None:
    from ckpteval.hfexport.write import export_checkpoint

    first = exports["mixtral_moe"]
    before = {p: p.stat().st_mtime_ns for p in first.output.rglob("*")}
    again = export_checkpoint(checkpoints["mixtral_moe"], first.output)
    assert again.reused and again.tensors_written == 0 and again.identity == first.identity
    assert {p: p.stat().st_mtime_ns for p in first.output.rglob("*")} == before
    # another checkpoint's export is not replaced without --force
    with pytest.raises(DeploymentError, match="another checkpoint"):
        export_checkpoint(checkpoints["qwen3_moe"], first.output)


def test_bfloat16_export_is_checked_against_the_checkpoint_rounded_alike(checkpoints, tmp_path: Path) -> None:
    import torch

    from ckpteval.hfexport.parity import check_parity
    from ckpteval.hfexport.write import export_checkpoint

    export = export_checkpoint(checkpoints["qwen3"], tmp_path / "bf16", dtype="bfloat16")
    assert export.dtype == "bfloat16" and export.checkpoint_dtype == "float32"
    assert {t.dtype for t in _tensors(export.output).values()} == {torch.bfloat16}
    report = check_parity(checkpoints["qwen3"], export.output)
    assert report.dtype == "bfloat16" and report.passed, report.differences
