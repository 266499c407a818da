"""The prefix cache's token tree: match, insert (with splits), LRU eviction under the memory budget.

The tree's tensors are tagged with the token they belong to, so a test sees that the KV a match returns
is that of the matched tokens, in order, after splits and evictions.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from ckpteval.server.prefix_cache import PrefixCache

LAYERS = 2
KV_BYTES = 1000  # per token, as the runner would compute it


def tagged(tokens: list[int]) -> tuple[Any, Any, list[float], list[list[int]], list[list[float]]]:
    """KV and scores for `tokens` whose every value names its token (so a match can be checked)."""
    import torch

    keys = torch.tensor(tokens, dtype=torch.float32)[None, :, None, None].expand(LAYERS, len(tokens), 1, 2).clone()
    incoming = [float(t) for t in tokens]
    top_ids = [[t, t + 1] for t in tokens]
    top_logprobs = [[-float(t), -float(t) - 1] for t in tokens]
    return keys, -keys, incoming, top_ids, top_logprobs


def insert(cache: PrefixCache, tokens: list[int]) -> bool:
    known = cache.match(tokens, 2).length
    keys, values, incoming, top_ids, top_logprobs = tagged(tokens[known:])
    return cache.insert(tokens, known, keys, values, incoming, top_ids, top_logprobs)


def cached_kv_tokens(cache: PrefixCache, tokens: list[int], count: int) -> list[int]:
    import torch

    match = cache.match(tokens)
    parts = match.kv_segments(count)
    keys = torch.cat([k for k, _ in parts], dim=1) if parts else torch.zeros(LAYERS, 0, 1, 2)
    values = torch.cat([v for _, v in parts], dim=1) if parts else torch.zeros(LAYERS, 0, 1, 2)
    assert torch.equal(values, -keys)
    return [int(x) for x in keys[0, :, 0, 0].tolist()]


def test_a_sequence_is_matched_after_insert_and_a_branch_splits_the_node() -> None:
    cache = PrefixCache(10**9, kv_bytes_per_token=KV_BYTES)
    first = [1, 2, 3, 4, 5, 6]
    assert cache.match(first).length == 0
    assert insert(cache, first)
    assert cache.match(first).length == 6
    assert cache.match([1, 2, 3, 9]).length == 3
    assert cache.match([7]).length == 0

    second = [1, 2, 3, 7, 8]  # branches inside the first node: it is split at 3
    assert insert(cache, second)
    assert cache.match(second).length == 5 and cache.match(first).length == 6
    assert cache.cached_tokens() == 8  # 1 2 3 | 4 5 6 | 7 8: the shared tokens once
    assert cached_kv_tokens(cache, first, 6) == first
    assert cached_kv_tokens(cache, second, 5) == second
    incoming, top_ids, top_logprobs = cache.match(second, 1).outputs(5, 1)
    assert incoming == [1.0, 2.0, 3.0, 7.0, 8.0]
    assert top_ids == [[t] for t in second] and top_logprobs == [[-float(t)] for t in second]


def test_a_node_with_fewer_alternatives_than_asked_is_not_a_match() -> None:
    cache = PrefixCache(10**9, kv_bytes_per_token=KV_BYTES)
    assert insert(cache, [1, 2, 3])  # two alternatives per token
    assert cache.match([1, 2, 3], 2).length == 3
    assert cache.match([1, 2, 3], 5).length == 0


def test_the_least_recently_used_leaf_goes_first_and_the_budget_is_never_exceeded() -> None:
    per_token = PrefixCache(0, kv_bytes_per_token=KV_BYTES).token_bytes(2)
    cache = PrefixCache(10 * per_token, kv_bytes_per_token=KV_BYTES)
    a, b, c = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    assert insert(cache, a) and insert(cache, b)
    cache.match(a)  # a is used again: b is now the least recently used
    assert insert(cache, c)  # 12 tokens do not fit 10: b goes
    assert cache.match(a).length == 4 and cache.match(c).length == 4 and cache.match(b).length == 0
    assert cache.stats.cache_bytes == 8 * per_token <= cache.budget_bytes
    assert cache.stats.evicted_tokens == 4
    assert cache.stats.peak_cache_bytes <= cache.budget_bytes


def test_a_sequence_larger_than_the_budget_is_not_cached_and_evicts_nothing() -> None:
    per_token = PrefixCache(0, kv_bytes_per_token=KV_BYTES).token_bytes(2)
    cache = PrefixCache(5 * per_token, kv_bytes_per_token=KV_BYTES)
    assert insert(cache, [1, 2, 3])
    assert not insert(cache, list(range(100, 110)))
    assert cache.match([1, 2, 3]).length == 3 and cache.stats.evicted_tokens == 0


def test_eviction_keeps_the_prefix_a_new_branch_hangs_from() -> None:
    per_token = PrefixCache(0, kv_bytes_per_token=KV_BYTES).token_bytes(2)
    cache = PrefixCache(8 * per_token, kv_bytes_per_token=KV_BYTES)
    assert insert(cache, [1, 2, 3, 4, 5, 6])
    # the new branch shares 1 2 3; making room for its 4 tokens must not evict them
    assert insert(cache, [1, 2, 3, 7, 8, 9, 10])
    assert cache.match([1, 2, 3, 7, 8, 9, 10]).length == 7
    assert cached_kv_tokens(cache, [1, 2, 3, 7, 8, 9, 10], 7) == [1, 2, 3, 7, 8, 9, 10]
    assert cache.match([1, 2, 3, 4]).length == 3  # the old branch went
    assert cache.stats.cache_bytes <= cache.budget_bytes


def test_insert_after_part_of_its_prefix_was_evicted_caches_nothing() -> None:
    per_token = PrefixCache(0, kv_bytes_per_token=KV_BYTES).token_bytes(2)
    cache = PrefixCache(6 * per_token, kv_bytes_per_token=KV_BYTES)
    assert insert(cache, [1, 2, 3])
    assert cache.match([1, 2, 3, 4, 5]).length == 3  # computed from token 3 on...
    assert insert(cache, [9, 9, 9, 9, 9, 9])  # ...meanwhile another row evicted 1 2 3
    keys, values, incoming, top_ids, top_logprobs = tagged([4, 5])
    assert not cache.insert([1, 2, 3, 4, 5], 3, keys, values, incoming, top_ids, top_logprobs)
    assert cache.match([1, 2, 3, 4, 5]).length == 0


def test_the_first_token_has_no_incoming_log_probability() -> None:
    cache = PrefixCache(10**9, kv_bytes_per_token=KV_BYTES)
    keys, values, _, top_ids, top_logprobs = tagged([1, 2])
    assert cache.insert([1, 2], 0, keys, values, [math.nan, -0.5], top_ids, top_logprobs)
    incoming, _, _ = cache.match([1, 2]).outputs(2, 1)
    assert math.isnan(incoming[0]) and incoming[1] == pytest.approx(-0.5)
