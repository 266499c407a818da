"""The prefix cache gives what computing every token gives, and computes each prefix once.

In this process against the runner's own full computation (the batches lm-eval's multiple-choice and
few-shot tasks make: shared contexts, nested prefixes, repeats, a prompt that is another's prefix, a
budget too small to keep anything), and over HTTP against the session's server (the cache is on by
default there, so every other test of that server runs through it too).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ckpteval.server.engine import ScoredRow
from ckpteval.server.prefix_cache import PrefixCache
from ckpteval.server.prefix_scoring import PrefixScorer, memory_per_token
from tests.deploy_support import RunningServer

TOLERANCE = 1e-4  # fp32


def _tree_tokens(rows: list[list[int]]) -> int:
    seen = {tuple(row[:i]) for row in rows for i in range(1, len(row) + 1)}
    return len(seen)


def _assert_same(got: list[ScoredRow], want: list[ScoredRow], rows: list[list[int]]) -> None:
    for g, w, row in zip(got, want, rows, strict=True):
        assert len(g.token_logprobs) == len(w.token_logprobs) and len(g.top_ids) == len(w.top_ids)
        assert (
            max((abs(a - b) for a, b in zip(g.token_logprobs, w.token_logprobs, strict=True)), default=0) <= TOLERANCE
        )
        assert g.top_ids == w.top_ids
        worst = max(
            abs(a - b)
            for ga, wa in zip(g.top_logprobs, w.top_logprobs, strict=True)
            for a, b in zip(ga, wa, strict=True)
        )
        assert worst <= TOLERANCE
        # lm-eval's is_greedy: the target's log-prob equals the top value exactly where it is the top token
        for i, value in enumerate(g.token_logprobs):
            assert g.top_ids[i][0] != row[i + 1] or value == g.top_logprobs[i][0]


def _few_shot_rows(tokenizer: Any) -> list[list[int]]:
    shots = "Q: what is two and two? A: four.\nQ: the colour of the sky? A: blue.\n"
    rows = []
    for question in ("how many legs has a cat?", "where does the sun rise?"):
        context = tokenizer.encode(shots + f"Q: {question} A:")
        rows += [context + tokenizer.encode(choice) for choice in (" four.", " in the east.", " two.", " east")]
    rows.append(rows[0])  # a repeat: answered from the cache
    rows.append(rows[0][:30])  # another row's prefix
    rows.append(tokenizer.encode("Unrelated text, shares nothing."))
    return rows


def test_scores_equal_the_full_computation_and_each_prefix_is_computed_once(tiny_loaded: Any) -> None:
    runner = tiny_loaded.runner
    rows = _few_shot_rows(runner.tokenizer)
    want = runner.score(rows, top_k=3)
    scorer = PrefixScorer(runner, PrefixCache(256 * 1024**2, kv_bytes_per_token=memory_per_token(runner)))
    got = scorer.score(rows, top_k=3)
    _assert_same(got, want, rows)
    # near the floor: a row recomputes the last token of its cached prefix, and rows sharing fewer than
    # MIN_SHARED_TOKENS beyond it (" four." and " two.") compute those each
    floor = _tree_tokens(rows)
    assert floor <= scorer.computed_tokens <= 1.1 * floor + len(rows), (scorer.computed_tokens, floor)
    assert scorer.computed_tokens < 0.4 * sum(len(r) for r in rows)
    # again, in another order and with fewer alternatives: everything comes from the cache
    before = scorer.computed_tokens
    _assert_same(scorer.score(rows[::-1], top_k=1)[::-1], runner.score(rows, top_k=1), rows)
    assert scorer.computed_tokens == before


def test_a_budget_too_small_for_any_row_still_scores_exactly(tiny_loaded: Any) -> None:
    runner = tiny_loaded.runner
    rows = _few_shot_rows(runner.tokenizer)
    scorer = PrefixScorer(
        runner, PrefixCache(4 * memory_per_token(runner), kv_bytes_per_token=memory_per_token(runner))
    )
    _assert_same(scorer.score(rows, top_k=2), runner.score(rows, top_k=2), rows)
    assert scorer.cache.stats.peak_cache_bytes <= scorer.cache.budget_bytes


def _score(server: RunningServer, tokens: list[int], logprobs: int = 1) -> dict[str, Any]:
    body = {"prompt": tokens, "max_tokens": 0, "logprobs": logprobs, "echo": True, "temperature": 0}
    status, payload = server.post("/v1/completions", body)
    assert status == 200, payload
    return dict(payload["choices"][0]["logprobs"])


def test_concurrent_requests_sharing_contexts_over_http(tiny_server: RunningServer, tiny_loaded: Any) -> None:
    runner = tiny_loaded.runner
    shots = "In the kitchen, she opens the fridge and takes out the milk. " * 4
    contexts = [runner.tokenizer.encode(shots + f"Then item {i} happens and") for i in range(4)]
    endings = [" she pours it.", " the cat drinks it.", " nothing.", " it spills on the floor."]
    rows = [c + runner.tokenizer.encode(e) for c in contexts for e in endings]
    _, before = tiny_server.get("/v1/stats")
    with ThreadPoolExecutor(len(rows)) as pool:
        answers = list(pool.map(lambda r: _score(tiny_server, r, 2), rows))
    _, after = tiny_server.get("/v1/stats")
    want = runner.score(rows, top_k=2)
    for answer, expected in zip(answers, want, strict=True):
        got = answer["token_logprobs"][1:]
        assert max(abs(a - b) for a, b in zip(got, expected.token_logprobs, strict=True)) <= TOLERANCE
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    computed = after["computed_tokens"] - before["computed_tokens"]
    assert prompt == sum(len(r) for r in rows)
    assert after["cached_tokens"] - before["cached_tokens"] == prompt - computed
    assert computed <= _tree_tokens(rows) + len(rows), (computed, _tree_tokens(rows))
    assert after["prefix_cache_peak_bytes"] <= after["prefix_cache_budget_bytes"]


def test_repeated_samples_share_their_prefill_and_generate_the_same(
    tiny_server: RunningServer, tiny_loaded: Any
) -> None:
    from tests.deploy_support import greedy_directly

    runner = tiny_loaded.runner
    # a start no other test's prompt has: the session's server caches what every test sent
    prompt = runner.tokenizer.encode(
        "\u00a7\u00b6 A prompt that is sampled four times over, with its prefill once. " * 2
    )
    _, before = tiny_server.get("/v1/stats")
    status, payload = tiny_server.post("/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0, "n": 4})
    assert status == 200, payload
    _, after = tiny_server.get("/v1/stats")
    expected = runner.tokenizer.decode(greedy_directly(runner.model, prompt, 8, runner.tokenizer.stop_token_ids))
    assert [c["text"] for c in payload["choices"]] == [expected] * 4
    assert after["prompt_tokens"] - before["prompt_tokens"] == 4 * len(prompt)
    # the first sample computes the prompt; the others only its last token (whose logits start them)
    assert after["computed_tokens"] - before["computed_tokens"] == len(prompt) + 3
    # a later run of the same prompt (the next repeat of a task) starts from the cache too
    status, again = tiny_server.post("/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0})
    assert status == 200 and again["choices"][0]["text"] == expected
    assert tiny_server.get("/v1/stats")[1]["computed_tokens"] - after["computed_tokens"] == 1


def test_generation_with_a_cached_prompt_is_unchanged(tiny_server: RunningServer, tiny_loaded: Any) -> None:
    from tests.deploy_support import greedy_directly

    runner = tiny_loaded.runner
    prompt = runner.tokenizer.encode("Once upon a time, in a cached prefix, there lived")
    _score(tiny_server, prompt)  # the prompt's scores are now in the cache
    body = {"prompt": prompt, "max_tokens": 12, "logprobs": 1, "echo": True, "temperature": 0}
    status, payload = tiny_server.post("/v1/completions", body)
    assert status == 200, payload
    choice = payload["choices"][0]
    want = runner.score([prompt], top_k=1)[0].token_logprobs
    got = choice["logprobs"]["token_logprobs"][1 : len(prompt)]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= TOLERANCE
    expected = greedy_directly(runner.model, prompt, 12, runner.tokenizer.stop_token_ids)
    assert choice["text"].endswith(runner.tokenizer.decode(expected))


def test_prompts_of_one_few_shot_prefix_arriving_together_compute_it_once(tiny_loaded: Any) -> None:
    """MMLU's generation items (issue 45): one subject's questions after its 5 shots arrive together; the
    first computes the shots, the others start from them, and each generates what it does alone."""
    import asyncio

    from ckpteval.server.engine import ModelRunner, SamplingParams
    from ckpteval.server.scheduler import GenerateJob, Scheduler
    from tests.deploy_support import greedy_directly

    loaded = tiny_loaded.runner
    runner = ModelRunner(loaded.model, loaded.tokenizer, device="cpu", max_context=loaded.max_context)
    runner.enable_prefix_cache(64 * 1024**2)
    shots = "Q: a question of the shots? A: its answer.\n" * 6
    prompts = [runner.tokenizer.encode(shots + f"Q: question number {i} of the subject? A:") for i in range(4)]

    def generate(prompts: list[list[int]]) -> Scheduler:
        scheduler = Scheduler(runner)

        async def main() -> list[Any]:
            loop = asyncio.get_running_loop()
            jobs = [GenerateJob(p, SamplingParams(max_tokens=2), loop.create_future(), loop) for p in prompts]
            for job in jobs:  # all queued before the thread starts: it sees them in one round
                scheduler.submit(job)
            scheduler.start()
            return list(await asyncio.gather(*(job.future for job in jobs)))

        try:
            results = asyncio.run(main())
        finally:
            scheduler.stop()
        for result, prompt in zip(results, prompts, strict=True):
            assert result.token_ids == greedy_directly(runner.model, prompt, 2, runner.tokenizer.stop_token_ids)
        assert scheduler.stats.prompt_tokens == sum(len(p) for p in prompts)
        return scheduler

    computed = generate(prompts).stats.computed_tokens
    # the prefix tree's tokens and at most one more per prompt (all four computing the shots: ~4x that)
    assert computed <= _tree_tokens(prompts) + len(prompts), (computed, _tree_tokens(prompts))
    # the next subject's first question beside this one's fifth: the one computes its whole prompt, the other
    # only its question (not as many tokens as the first, which one prompt forward would feed both)
    fifth = runner.tokenizer.encode(shots + "Q: question number 5 of the subject? A:")
    other = runner.tokenizer.encode("Other shots. " * 12 + "Q: its first question? A:")
    computed = generate([fifth, other]).stats.computed_tokens
    assert computed <= len(other) + len(fifth) - len(runner.tokenizer.encode(shots)) + 2, computed
