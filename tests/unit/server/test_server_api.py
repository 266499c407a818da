"""The server's routes over real HTTP, checked against the model computed directly in this process."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from tests.deploy_support import RunningServer, greedy_directly, score_directly
from tests.support.waiting import wait_until

TEXT = "The capital of France is Paris, and the capital of Germany is Berlin."


def completion(server: RunningServer, **body: Any) -> dict[str, Any]:
    status, payload = server.post("/v1/completions", body)
    assert status == 200, payload
    return payload


def test_echo_logprobs_equal_the_models_own(tiny_server: RunningServer, tiny_loaded: Any) -> None:
    tokens = tiny_loaded.runner.tokenizer.encode(TEXT)
    expected = score_directly(tiny_loaded.runner.model, tokens)
    for prompt in (TEXT, tokens):
        choice = completion(tiny_server, prompt=prompt, max_tokens=1, logprobs=1, echo=True, temperature=0)["choices"][
            0
        ]
        logprobs = choice["logprobs"]
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        assert len(logprobs["tokens"]) == len(tokens) + 1  # the prompt plus the one generated token
        assert logprobs["token_logprobs"][1:-1] == pytest.approx(expected, abs=1e-4)
        assert choice["text"].startswith(TEXT)
        # lm-eval's is_greedy test: a token equal to the argmax has exactly the top value
        for token, lp, top in zip(
            logprobs["tokens"][1:], logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:], strict=True
        ):
            assert len(top) == 1
            ((best_piece, best_lp),) = top.items()
            assert lp <= best_lp + 1e-6
            if best_piece == token:
                assert lp == best_lp
        assert logprobs["text_offset"][:3] == [0, 1, 2]  # bytes: one character per token here


def test_top_logprobs_are_sorted_alternatives(tiny_server: RunningServer) -> None:
    choice = completion(tiny_server, prompt="Hello there", max_tokens=0, logprobs=5, echo=True, temperature=0)[
        "choices"
    ][0]
    assert len(choice["logprobs"]["tokens"]) == len("Hello there")  # max_tokens=0: the prompt only
    assert choice["text"] == "Hello there"
    for top in choice["logprobs"]["top_logprobs"][1:]:
        values = list(top.values())
        assert len(values) == 5 and values == sorted(values, reverse=True)


def test_greedy_completion_equals_recomputing_the_model(tiny_server: RunningServer, tiny_loaded: Any) -> None:
    tokenizer = tiny_loaded.runner.tokenizer
    prompt = tokenizer.encode("Once upon a time")
    expected = greedy_directly(tiny_loaded.runner.model, prompt, 24, tokenizer.stop_token_ids)
    payload = completion(tiny_server, prompt=prompt, max_tokens=24, temperature=0)
    choice = payload["choices"][0]
    assert choice["text"] == tokenizer.decode(expected)
    assert choice["finish_reason"] == ("length" if len(expected) == 24 else "stop")
    assert payload["usage"]["prompt_tokens"] == len(prompt)
    assert payload["usage"]["completion_tokens"] == len(expected) + (0 if len(expected) == 24 else 1)


def test_several_prompts_keep_their_order(tiny_server: RunningServer, tiny_loaded: Any) -> None:
    tokenizer = tiny_loaded.runner.tokenizer
    prompts = ["a", "a much longer prompt than the first one", "mid length"]
    payload = completion(tiny_server, prompt=prompts, max_tokens=8, temperature=0)
    assert [c["index"] for c in payload["choices"]] == [0, 1, 2]
    for prompt, choice in zip(prompts, payload["choices"], strict=True):
        expected = greedy_directly(tiny_loaded.runner.model, tokenizer.encode(prompt), 8, tokenizer.stop_token_ids)
        assert choice["text"] == tokenizer.decode(expected)


def test_echo_without_logprobs_returns_prompt_and_continuation(tiny_server: RunningServer) -> None:
    plain = completion(tiny_server, prompt="Hi", max_tokens=6, temperature=0)["choices"][0]["text"]
    echoed = completion(tiny_server, prompt="Hi", max_tokens=6, temperature=0, echo=True)["choices"][0]["text"]
    assert echoed == "Hi" + plain


def test_generation_logprobs_match_scoring_the_result(tiny_server: RunningServer, tiny_loaded: Any) -> None:
    prompt = tiny_loaded.runner.tokenizer.encode("Log-probs of generated tokens")
    choice = completion(tiny_server, prompt=prompt, max_tokens=6, temperature=0, logprobs=2)["choices"][0]
    generated = [tiny_loaded.runner.tokenizer.pieces.index(p) for p in choice["logprobs"]["tokens"]]
    rescored = score_directly(tiny_loaded.runner.model, prompt + generated)[len(prompt) - 1 :]
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(rescored, abs=1e-4)
    assert all(len(top) == 2 for top in choice["logprobs"]["top_logprobs"])


def test_stop_sequence_cuts_the_text(tiny_server: RunningServer) -> None:
    full = completion(tiny_server, prompt="Stop me", max_tokens=32, temperature=0)["choices"][0]["text"]
    position, stop = next((i, ch) for i, ch in enumerate(full) if i > 2 and ch.isascii() and ch.isprintable())
    choice = completion(tiny_server, prompt="Stop me", max_tokens=32, temperature=0, stop=[stop])["choices"][0]
    assert choice["text"] == full[: full.index(stop)]
    assert choice["finish_reason"] == "stop"
    assert position >= full.index(stop)


def test_sampling_is_reproducible_with_a_seed(tiny_server: RunningServer) -> None:
    def sample(seed: int) -> str:
        body = {"prompt": "Random", "max_tokens": 24, "temperature": 1.0, "seed": seed}
        return str(completion(tiny_server, **body)["choices"][0]["text"])

    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3, 4)}) > 1
    greedy = completion(tiny_server, prompt="Random", max_tokens=24, temperature=0)["choices"][0]["text"]
    assert sample(7) != greedy or sample(8) != greedy


def test_n_choices(tiny_server: RunningServer) -> None:
    payload = completion(tiny_server, prompt=["x", "y"], n=2, max_tokens=4, temperature=0)
    texts = [c["text"] for c in payload["choices"]]
    assert len(texts) == 4 and texts[0] == texts[1] and texts[2] == texts[3]


def test_chat_uses_the_checkpoints_template(tiny_server: RunningServer, tiny_loaded: Any) -> None:
    tokenizer = tiny_loaded.runner.tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
    prompt = tokenizer.encode(tokenizer.render_chat(messages), add_special_tokens=False)
    expected = greedy_directly(tiny_loaded.runner.model, prompt, 12, tokenizer.stop_token_ids)
    for path in ("/v1/chat/completions", "/v1/chat/completions/"):
        status, payload = tiny_server.post(path, {"messages": messages, "max_tokens": 12, "temperature": 0})
        assert status == 200, payload
        assert payload["object"] == "chat.completion"
        assert payload["choices"][0]["message"] == {"role": "assistant", "content": tokenizer.decode(expected)}
        assert payload["usage"]["prompt_tokens"] == len(prompt)


def test_chat_logprobs(tiny_server: RunningServer) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    status, payload = tiny_server.post("/v1/chat/completions", body)
    assert status == 200
    content = payload["choices"][0]["logprobs"]["content"]
    assert 1 <= len(content) <= 5
    for entry in content:
        assert entry["logprob"] == entry["top_logprobs"][0]["logprob"]  # greedy: the chosen token is the best
        assert len(entry["top_logprobs"]) == 3


def test_models_health_and_trailing_slashes(tiny_server: RunningServer) -> None:
    for path in ("/v1/models", "/v1/models/"):
        status, payload = tiny_server.get(path)
        assert status == 200 and payload["data"][0]["id"] == "megatron-model"
        assert payload["data"][0]["max_model_len"] == 2048
    for path in ("/v1/health", "/v1/health/", "/health"):
        status, health = tiny_server.get(path)
        assert status == 200 and health["status"] == "healthy"
        assert health["checkpoint"]["iteration"] == "0" and len(health["checkpoint"]["content"]["sha256"]) == 64
    status, payload = tiny_server.post("/v1/completions/", {"prompt": "x", "max_tokens": 1})
    assert status == 200 and payload["object"] == "text_completion"


def test_tokenizer_routes(tiny_server: RunningServer) -> None:
    status, info = tiny_server.get("/tokenizer_info")
    assert status == 200 and info["eos_token"] == "<|endoftext|>" and "assistant:" in info["chat_template"]
    status, tokens = tiny_server.post("/tokenize", {"prompt": "héllo", "add_special_tokens": False})
    assert tokens["tokens"] == list("héllo".encode()) and tokens["count"] == 6
    assert tiny_server.post("/detokenize", {"tokens": tokens["tokens"]}) == (200, {"prompt": "héllo"})


def test_concurrent_scoring_is_batched_and_exact(tiny_server: RunningServer, tiny_loaded: Any) -> None:
    tokenizer = tiny_loaded.runner.tokenizer
    prompts = [tokenizer.encode(f"{i}: " + TEXT[: 10 + 3 * i]) for i in range(32)]
    before = tiny_server.get("/v1/stats")[1]

    def score(tokens: list[int]) -> list[float]:
        body = {"prompt": tokens, "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
        return completion(tiny_server, **body)["choices"][0]["logprobs"]["token_logprobs"][1:-1]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(score, prompts))
    after = tiny_server.get("/v1/stats")[1]
    for tokens, got in zip(prompts, results, strict=True):
        assert got == pytest.approx(score_directly(tiny_loaded.runner.model, tokens), abs=1e-4)
    assert after["score_rows"] - before["score_rows"] == 32
    assert after["score_forwards"] - before["score_forwards"] < 32  # some requests shared a forward


def test_concurrent_generations_of_different_lengths(tiny_server: RunningServer, tiny_loaded: Any) -> None:
    tokenizer = tiny_loaded.runner.tokenizer
    prompts = ["a", "bb bb", "a longer prompt, left-padded beside the short ones", "xyz"] * 2
    lengths = [3, 17, 9, 12] * 2

    def generate(args: tuple[str, int]) -> str:
        prompt, n = args
        return str(completion(tiny_server, prompt=prompt, max_tokens=n, temperature=0)["choices"][0]["text"])

    before = tiny_server.get("/v1/stats")[1]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(generate, zip(prompts, lengths, strict=True)))
    after = tiny_server.get("/v1/stats")[1]
    for (prompt, n), text in zip(zip(prompts, lengths, strict=True), results, strict=True):
        expected = greedy_directly(tiny_loaded.runner.model, tokenizer.encode(prompt), n, tokenizer.stop_token_ids)
        assert text == tokenizer.decode(expected)
    assert after["generation_batches"] - before["generation_batches"] < 8


def _wait_for_generation_steps(server: RunningServer, steps: int, long: Future[Any], timeout: float = 120) -> None:
    """Wait until the server has decoded `steps` steps (the long request is running); fail after `timeout`, or
    when the long request ended first."""
    wait_until(
        lambda: server.get("/v1/stats")[1]["generation_steps"] >= steps,
        timeout=timeout,
        what=f"{steps} generation steps while the long request runs",
        interval=0.01,
        unless=long.done,
        context=lambda: f"the long request: {long.result() if long.done() else 'still running'}",
    )


def test_a_short_generation_does_not_wait_for_a_long_one(tiny_server: RunningServer, tiny_loaded: Any) -> None:
    tokenizer = tiny_loaded.runner.tokenizer
    steps_before = tiny_server.get("/v1/stats")[1]["generation_steps"]
    with ThreadPoolExecutor(2) as pool:
        body = {"prompt": "long", "max_tokens": 1500, "temperature": 0, "stop": ["\x00\x01\x02"]}
        long = pool.submit(completion, tiny_server, **body)
        _wait_for_generation_steps(tiny_server, steps_before + 5, long)  # the long batch is running
        short = completion(tiny_server, prompt="short", max_tokens=2, temperature=0)
        assert not long.done()  # the short request came back while the long one is still generating
        # and it is the answer it gets alone: its own 2 greedy tokens
        expected = greedy_directly(tiny_loaded.runner.model, tokenizer.encode("short"), 2, tokenizer.stop_token_ids)
        assert short["choices"][0]["text"] == tokenizer.decode(expected)
        assert long.result()["usage"]["completion_tokens"] > 100


def test_echo_logprobs_with_several_generated_tokens(tiny_server: RunningServer, tiny_loaded: Any) -> None:
    tokenizer = tiny_loaded.runner.tokenizer
    prompt = tokenizer.encode("Echo and generate")
    choice = completion(tiny_server, prompt=prompt, max_tokens=4, temperature=0, logprobs=1, echo=True)["choices"][0]
    logprobs = choice["logprobs"]
    generated = [tokenizer.pieces.index(p) for p in logprobs["tokens"][len(prompt) :]]
    assert logprobs["tokens"][: len(prompt)] == [tokenizer.pieces[t] for t in prompt]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = score_directly(tiny_loaded.runner.model, prompt + generated)
    assert logprobs["token_logprobs"][1:] == pytest.approx(expected, abs=1e-4)
    assert choice["text"] == "Echo and generate" + tokenizer.decode(generated)


def test_a_one_token_prompt(tiny_server: RunningServer) -> None:
    choice = completion(tiny_server, prompt=[65], max_tokens=1, logprobs=1, echo=True, temperature=0)["choices"][0]
    assert choice["logprobs"]["tokens"][0] == "A" and len(choice["logprobs"]["tokens"]) == 2
    assert choice["logprobs"]["token_logprobs"][0] is None and choice["logprobs"]["token_logprobs"][1] < 0


def test_a_request_arriving_mid_generation_joins_the_running_batch(
    tiny_server: RunningServer, tiny_loaded: Any
) -> None:
    """Continuous batching over HTTP: the late request is decoded in the same steps as the running one,
    comes back long before it, and both generate exactly what they generate alone."""
    tokenizer = tiny_loaded.runner.tokenizer
    before = tiny_server.get("/v1/stats")[1]
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(
            completion, tiny_server, prompt="a long one", max_tokens=400, temperature=0, stop=["\x00\x01"]
        )
        _wait_for_generation_steps(tiny_server, before["generation_steps"] + 5, long)
        started = time.perf_counter()
        short = completion(tiny_server, prompt="late", max_tokens=8, temperature=0)
        short_seconds = time.perf_counter() - started
        assert not long.done()
        long_text = long.result()["choices"][0]["text"]
        long_seconds = time.perf_counter() - started
    after = tiny_server.get("/v1/stats")[1]
    assert after["generation_joins"] - before["generation_joins"] >= 1
    assert after["max_generation_batch"] >= 2  # one decode step served both
    assert short_seconds < long_seconds / 2
    for prompt, n, text in (("a long one", 400, long_text), ("late", 8, short["choices"][0]["text"])):
        expected = greedy_directly(tiny_loaded.runner.model, tokenizer.encode(prompt), n, tokenizer.stop_token_ids)
        assert text == tokenizer.decode(expected)
