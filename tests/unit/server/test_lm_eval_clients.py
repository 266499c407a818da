"""lm-eval's own API clients (nvidia-lm-eval 26.3) against the server, offline: the checkpoint's tokenizer
directory is all they need."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.deploy_support import RunningServer, greedy_directly, score_directly


@pytest.fixture(scope="module")
def lm_eval_api() -> Any:
    from lm_eval.api.instance import Instance
    from lm_eval.models.api_models import JsonChatStr
    from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI

    return Instance, JsonChatStr, LocalCompletionsAPI, LocalChatCompletion


def test_loglikelihood_equals_the_models_own(
    tiny_server: RunningServer, tiny_checkpoint: Path, tiny_loaded: Any, lm_eval_api: Any
) -> None:
    Instance, _, LocalCompletionsAPI, _ = lm_eval_api
    lm = LocalCompletionsAPI(
        model="megatron-model",
        base_url=f"{tiny_server.url}/v1/completions",
        tokenizer=str(tiny_checkpoint / "tokenizer"),
        tokenizer_backend="huggingface",
        num_concurrent=4,
        max_retries=1,
    )
    pairs = [
        ("The capital of France is", " Paris"),
        ("The capital of France is", " Berlin"),
        ("Question: 2 + 2 = ?\nAnswer:", " 4"),
        ("A", "B"),
    ]
    requests = [Instance("loglikelihood", doc={}, arguments=pair, idx=i) for i, pair in enumerate(pairs)]
    results = lm.loglikelihood(requests)

    tokenizer = tiny_loaded.runner.tokenizer
    for (context, continuation), (loglikelihood, is_greedy) in zip(pairs, results, strict=True):
        context_ids = tokenizer.encode(context)
        tokens = context_ids + tokenizer.encode(continuation)
        per_token = score_directly(tiny_loaded.runner.model, tokens)[len(context_ids) - 1 :]
        assert loglikelihood == pytest.approx(sum(per_token), abs=1e-4)
        greedy = [
            int(t) == greedy_directly(tiny_loaded.runner.model, tokens[:i], 1, frozenset())[0]
            for i, t in enumerate(tokens)
            if i >= len(context_ids)
        ]
        assert is_greedy == all(greedy)


def test_generate_until(tiny_server: RunningServer, tiny_checkpoint: Path, tiny_loaded: Any, lm_eval_api: Any) -> None:
    Instance, _, LocalCompletionsAPI, _ = lm_eval_api
    lm = LocalCompletionsAPI(
        model="megatron-model",
        base_url=f"{tiny_server.url}/v1/completions",
        tokenizer=str(tiny_checkpoint / "tokenizer"),
        tokenizer_backend="huggingface",
        max_retries=1,
    )
    request = Instance(
        "generate_until", doc={}, arguments=("Once upon", {"until": ["\x01\x02"], "max_gen_toks": 12}), idx=0
    )
    (text,) = lm.generate_until([request])
    tokenizer = tiny_loaded.runner.tokenizer
    expected = greedy_directly(tiny_loaded.runner.model, tokenizer.encode("Once upon"), 12, tokenizer.stop_token_ids)
    assert text == tokenizer.decode(expected)


def test_chat_completions_client(tiny_server: RunningServer, tiny_loaded: Any, lm_eval_api: Any) -> None:
    Instance, JsonChatStr, _, LocalChatCompletion = lm_eval_api
    lm = LocalChatCompletion(
        model="megatron-model", base_url=f"{tiny_server.url}/v1/chat/completions", tokenizer_backend=None, max_retries=1
    )
    messages = [{"role": "user", "content": "Say something."}]
    request = Instance(
        "generate_until",
        doc={},
        arguments=(JsonChatStr(json.dumps(messages)), {"until": ["\x01\x02"], "max_gen_toks": 10}),
        idx=0,
    )
    (text,) = lm.generate_until([request])
    tokenizer = tiny_loaded.runner.tokenizer
    prompt = tokenizer.encode(tokenizer.render_chat(messages), add_special_tokens=False)
    assert text == tokenizer.decode(greedy_directly(tiny_loaded.runner.model, prompt, 10, tokenizer.stop_token_ids))
