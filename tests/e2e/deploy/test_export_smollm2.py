"""SmolLM2-135M-Instruct (prepared from the packaged GGUF) exported back to Hugging Face: the tensors transformers
dequantized from the GGUF come back bit for bit, and the parity check passes on the real model."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def exported(smollm2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from ckpteval.hfexport.write import export_checkpoint

    started = time.monotonic()
    export = export_checkpoint(smollm2_checkpoint, tmp_path_factory.mktemp("hf") / "smollm2")
    print(f"export: {time.monotonic() - started:.1f} s")
    return export


def test_prepare_then_export_gives_back_the_original_tensors(exported: Any, smollm2_hf: tuple[Any, Any]) -> None:
    import torch
    from safetensors.torch import load_file

    _, hf_model = smollm2_hf
    original = hf_model.state_dict()
    ours = load_file(str(exported.output / "model.safetensors"))
    assert hf_model.config.tie_word_embeddings and "lm_head.weight" not in ours  # tied: stored once, as HF does
    assert sorted(ours) == sorted(k for k in original if k != "lm_head.weight")
    assert [k for k in ours if not torch.equal(ours[k], original[k])] == []
    assert exported.vocab_size == exported.padded_vocab_size == 49152


def test_parity_on_the_real_model(exported: Any, smollm2_checkpoint: Path) -> None:
    import json

    from transformers import AutoTokenizer

    from ckpteval.hfexport.parity import TOLERANCE, check_parity

    config = json.loads((exported.output / "config.json").read_text())
    assert (config["model_type"], config["rope_theta"]) == ("llama", 100000.0)
    assert config["rms_norm_eps"] == pytest.approx(1e-5)  # the GGUF's float32 1e-5, as the checkpoint's args hold it
    tokenizer = AutoTokenizer.from_pretrained(str(exported.output))
    assert "<|im_start|>" in tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    generation = json.loads((exported.output / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.eos_token_id

    started = time.monotonic()
    report = check_parity(smollm2_checkpoint, exported.output)
    took = time.monotonic() - started
    print(f"parity: {took:.1f} s, logits max |diff| {report.max_abs_logit_diff:.2e} (tolerance {TOLERANCE})")
    assert report.differences == [] and report.max_abs_logit_diff <= TOLERANCE
    assert report.greedy_identical and all(len(p.greedy_megatron) > 0 for p in report.prompts)
    assert max(p.tokens for p in report.prompts) == 384
