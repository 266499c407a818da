"""A checkpoint written by Megatron-Bridge 0.3.1's own Hugging Face importer exports and passes parity.

A tiny SmolLM2-shaped model (Llama: GQA, tied embeddings, RoPE base 100000, bf16; norms random so that a norm
mapped wrong shows) is written as a Megatron checkpoint by Bridge's importer run from its wheel
(`tests.support.megatron_bridge.import_with_bridge`: `AutoBridge.import_ckpt`'s steps, Bridge's own parameter
mappings and `save_megatron_model`); that checkpoint is read by ckpteval (Bridge's layout: run_config.yaml, the
tokenizer copied), exported, compared tensor by tensor with the model Bridge started from, and checked for parity.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]


def _write_hf_model(directory: Path) -> None:
    import torch
    import transformers

    from ckpteval.server.tokenizer import write_byte_tokenizer

    config = transformers.LlamaConfig(
        vocab_size=257, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=100000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, initializer_range=0.2, bos_token_id=None, eos_token_id=256, pad_token_id=None,
    )  # fmt: skip
    torch.manual_seed(41)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for key, param in model.named_parameters():
            if "norm" in key:
                param.copy_(torch.randn(param.shape) * 0.1 + 1.0)
    model.save_pretrained(str(directory))
    write_byte_tokenizer(directory)


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the Hugging Face model, the Megatron checkpoint Megatron-Bridge's importer wrote from it)."""
    from tests.support.megatron_bridge import bridge_source

    source = bridge_source()
    if isinstance(source, str):
        pytest.skip(source)
    base = tmp_path_factory.mktemp("bridge-import")
    hf_dir, megatron = base / "hf", base / "megatron"
    _write_hf_model(hf_dir)
    # Bridge makes its own one-rank world: not on the rendezvous port this process's world holds
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.megatron_bridge", "import", str(hf_dir), str(megatron)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return hf_dir, megatron


@pytest.fixture(scope="module")
def exported(imported: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    from ckpteval.hfexport.write import export_checkpoint

    return export_checkpoint(imported[1], tmp_path_factory.mktemp("export") / "hf")


def test_bridge_wrote_its_own_layout(imported: tuple[Path, Path]) -> None:
    from ckpteval.checkpoint.layout import MEGATRON_BRIDGE, locate_checkpoint

    layout = locate_checkpoint(imported[1])
    assert layout.kind == MEGATRON_BRIDGE and (layout.iter_dir / "run_config.yaml").is_file()
    assert layout.tokenizer_dir == layout.iter_dir / "tokenizer"  # save_megatron_model copied the model's


def test_the_export_gives_back_the_model_bridge_imported_bit_for_bit(imported: tuple[Path, Path], exported) -> None:
    import torch
    from safetensors.torch import load_file

    original = load_file(str(imported[0] / "model.safetensors"))
    ours = load_file(str(exported.output / "model.safetensors"))
    assert (exported.family, exported.checkpoint_dtype, exported.dtype) == ("llama", "bfloat16", "bfloat16")
    assert sorted(ours) == sorted(original) and "lm_head.weight" not in ours  # tied: stored once
    assert [k for k in ours if ours[k].dtype != original[k].dtype or not torch.equal(ours[k], original[k])] == []


def test_the_export_of_bridge_s_checkpoint_passes_parity(imported: tuple[Path, Path], exported) -> None:
    import json

    from ckpteval.hfexport.parity import TOLERANCE, check_parity

    config = json.loads((exported.output / "config.json").read_text())
    original = json.loads((imported[0] / "config.json").read_text())
    for key in ("num_hidden_layers", "hidden_size", "num_key_value_heads", "head_dim", "vocab_size",
                "tie_word_embeddings", "rope_parameters", "rms_norm_eps"):  # fmt: skip
        assert config[key] == original[key], key
    report = check_parity(imported[1], exported.output)
    print(f"bridge import: logits max |diff| {report.max_abs_logit_diff:.2e} (tolerance {TOLERANCE})")
    assert report.differences == [] and report.max_abs_logit_diff <= TOLERANCE
    assert report.greedy_identical and report.tensors_compared == exported.tensors == 20
    assert len({p.greedy_megatron for p in report.prompts}) == 3  # the prompts' continuations differ
