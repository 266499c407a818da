"""The real SmolLM2-135M-Instruct, converted to Megatron and served: it must behave like the original."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy_support import RunningServer
from tests.e2e.conftest import MODEL_ID

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Megatron checkpoints store their arguments in common.pt. " * 12,
]


def hf_logprobs(hf: tuple[Any, Any], text: str, continuation: str) -> float:
    import torch

    tokenizer, model = hf
    context = tokenizer(text)["input_ids"]
    tokens = context + tokenizer(continuation)["input_ids"]
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)
    return sum(float(logprobs[i - 1, tokens[i]]) for i in range(len(context), len(tokens)))


def test_logits_match_transformers(smollm2_loaded: Any, smollm2_hf: tuple[Any, Any]) -> None:
    import torch

    from ckpteval.server.packaged import megatron_logits

    tokenizer, model = smollm2_hf
    for text in PROMPTS:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        with torch.inference_mode():
            reference = model(ids).logits.float()
        ours = megatron_logits(smollm2_loaded.runner.model, ids).float()
        assert float((ours - reference).abs().max()) < 1e-3, text
        assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def test_paris_beats_berlin_over_http(smollm2_server: RunningServer, smollm2_hf: tuple[Any, Any]) -> None:
    scores = {}
    for city in (" Paris", " Berlin"):
        body = {
            "model": MODEL_ID,
            "prompt": "The capital of France is" + city,
            "max_tokens": 1,
            "logprobs": 1,
            "echo": True,
            "temperature": 0,
        }
        status, payload = smollm2_server.post("/v1/completions", body)
        assert status == 200, payload
        logprobs = payload["choices"][0]["logprobs"]
        assert logprobs["tokens"][-2] == city
        scores[city] = logprobs["token_logprobs"][-2]
        assert scores[city] == pytest.approx(hf_logprobs(smollm2_hf, "The capital of France is", city), abs=1e-3)
    assert scores[" Paris"] > -1.0 > -5.0 > scores[" Berlin"]


def test_lm_eval_loglikelihood(
    smollm2_server: RunningServer, smollm2_checkpoint: Path, smollm2_hf: tuple[Any, Any]
) -> None:
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    lm = LocalCompletionsAPI(
        model=MODEL_ID,
        base_url=f"{smollm2_server.url}/v1/completions",
        tokenizer=str(smollm2_checkpoint / "tokenizer"),
        tokenizer_backend="huggingface",
        num_concurrent=2,
        max_retries=1,
    )
    pairs = [("The capital of France is", city) for city in (" Paris", " Berlin", " banana")]
    results = lm.loglikelihood([Instance("loglikelihood", doc={}, arguments=p, idx=i) for i, p in enumerate(pairs)])
    for (context, continuation), (loglikelihood, _) in zip(pairs, results, strict=True):
        assert loglikelihood == pytest.approx(hf_logprobs(smollm2_hf, context, continuation), abs=1e-3)
    paris, berlin, banana = (r[0] for r in results)
    assert paris > berlin > banana
    assert results[0][1] is True  # " Paris" is the greedy continuation


def test_chat_answers(smollm2_server: RunningServer) -> None:
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 40,
        "temperature": 0,
    }
    status, payload = smollm2_server.post("/v1/chat/completions", body)
    assert status == 200, payload
    choice = payload["choices"][0]
    assert "Paris" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"  # ended by <|im_end|>, not cut off


def test_kv_cache_generation_equals_recompute(smollm2_loaded: Any) -> None:
    from ckpteval.server.engine import SamplingParams

    runner = smollm2_loaded.runner
    prompts = [runner.tokenizer.encode(p) for p in ("The capital of France is", "Here is a list of three fruits:")]
    params = SamplingParams(max_tokens=16)
    batched = runner.generate([(p, params) for p in prompts])
    for prompt, generation in zip(prompts, batched, strict=True):
        assert generation.token_ids == runner.generate_without_cache(prompt, params).token_ids
