"""Parity with Hugging Face transformers, per architecture the builtin serves.

The same random weights as a transformers model (MixtralForCausalLM, Qwen3MoeForCausalLM,
Qwen2MoeForCausalLM, NemotronForCausalLM, MistralForCausalLM with a sliding window, Llama4ForCausalLM
with qk-L2-norm and with a NoPE layer, Llama-3 with RoPE scaling, Qwen2, Qwen3) and as a Megatron
torch_dist checkpoint written by megatron-core, served through the builtin's `load_model` (the
server's path: args -> architecture -> GPTModel -> weights), give the same next-token log-probabilities
(<= 1e-4 absolute in fp32) and the same greedy generations (with the KV cache, and batched with a
shorter prompt so the sliding window meets left padding).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.corpus import built_once
from tests.support.corpus.architectures import NAMES, build_many, hf_reference_dir

TOLERANCE = 1e-4
PROMPT = "Sliding windows, experts & norms: ünïcode too. The quick brown fox jumps over"
SHORT = "Hello, world"
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return built_once(tmp_path_factory, "architectures", lambda root: build_many({n: root / n for n in NAMES}))


def _hf_model(checkpoint: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(hf_reference_dir(checkpoint)), dtype=torch.float32, attn_implementation="eager"
    ).eval()


def _hf_greedy(model: Any, ids: list[int]) -> list[int]:
    import torch

    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=256, pad_token_id=256
        )
    tokens = out[0, len(ids) :].tolist()
    return tokens[: tokens.index(256)] if 256 in tokens else tokens


@pytest.mark.parametrize("name", NAMES)
def test_parity_with_transformers(name: str, checkpoints: dict[str, Path]) -> None:
    import torch

    from ckpteval.server.engine import SamplingParams
    from ckpteval.server.serve import load_model

    checkpoint = checkpoints[name]
    loaded = load_model(checkpoint, device="cpu", dtype="float32")
    runner = loaded.runner
    hf = _hf_model(checkpoint)
    ids = list(PROMPT.encode())

    with torch.inference_mode():
        reference = torch.log_softmax(hf(torch.tensor([ids])).logits.float(), dim=-1)[0]
        length = len(ids)
        mask = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)[None, None]
        logits = runner.model(
            input_ids=torch.tensor([ids]), position_ids=torch.arange(length)[None], attention_mask=mask
        )
        ours = torch.log_softmax(logits.float(), dim=-1)[0]
    full_diff = float((ours - reference).abs().max())
    scored = runner.score([ids], top_k=1)[0]
    target = reference[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    scored_diff = float((torch.tensor(scored.token_logprobs) - target).abs().max())
    print(f"{name}: max |log-prob diff| all tokens {full_diff:.2e}, scored next tokens {scored_diff:.2e}")
    assert full_diff <= TOLERANCE and scored_diff <= TOLERANCE

    short = list(SHORT.encode())
    greedy = runner.generate(
        [(ids, SamplingParams(max_tokens=NEW_TOKENS)), (short, SamplingParams(max_tokens=NEW_TOKENS))]
    )
    assert greedy[0].token_ids == _hf_greedy(hf, ids)
    assert greedy[1].token_ids == _hf_greedy(hf, short)
    assert len(set(greedy[0].token_ids)) > 1  # a random model that repeats one id would prove little
