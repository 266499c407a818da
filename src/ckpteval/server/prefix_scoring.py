"""Scoring with the prefix cache: each row computes only the tokens no earlier row computed.

A batch of rows to score goes in waves. Rows the cache holds whole are answered from it. Of the others,
sorted by their tokens, the first of each run sharing a prefix beyond what is cached (the 4 choices of a
HellaSwag item after their shared context) is computed in this wave and cached; the rest of the run wait
for the next wave, where that prefix is cached and only their own ends are computed. Rows of a wave are
put into forwards by the length they compute (so a 20-token ending does not pad to a 700-token context).

One forward places each row's cached KV in megatron's `StaticInferenceContext`, right-aligned at slot M
(the longest cached part in the forward; shorter ones are left-padded with masked slots), and feeds the
rest of the row from slot M on, right-padded. Keys are stored unrotated and rotated by slot, so only
relative positions matter, as when the row is computed whole; `position_ids` carry the true positions
for models with learned absolute embeddings. The logits of every fed position give the log-probabilities
and top-k, as in `ModelRunner.launch_scores`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ckpteval.server.prefix_cache import Match, PrefixCache, common_prefix_length
from ckpteval.server.scores import ScoredRow

# A row waits for another's prefix only when that saves at least this many tokens.
MIN_SHARED_TOKENS = 8
# Rows computing n and m tokens share a forward when max <= ratio x min + slack (padding stays bounded).
LENGTH_RATIO = 1.5
LENGTH_SLACK = 16


class ModelRunner(Protocol):
    """What the scorer reads of the engine's `ModelRunner` (which owns the scorer: the engine imports this
    module, not the other way round)."""

    @property
    def model(self) -> Any: ...
    @property
    def device(self) -> Any: ...
    @property
    def max_context(self) -> int: ...
    @property
    def vocab_limit(self) -> int: ...
    @property
    def _shape(self) -> tuple[int, int, int]: ...
    @property
    def _kv_channels(self) -> int: ...


@dataclass
class _Item:
    index: int
    tokens: list[int]
    match: Match
    reuse: int  # cached tokens whose KV this forward reuses (the match less one: see prefix_cache)

    @property
    def computed(self) -> int:
        return len(self.tokens) - self.reuse


class PrefixScorer:
    """Scores rows through the cache; `computed_tokens` counts what went through the model."""

    def __init__(self, runner: ModelRunner, cache: PrefixCache) -> None:
        self.runner = runner
        self.cache = cache
        self.computed_tokens = 0
        self.forwards = 0
        model = runner.model
        self._layer_numbers = [layer.self_attention.layer_number for layer in model.decoder.layers]

    def score(self, rows: list[list[int]], top_k: int) -> list[ScoredRow]:
        """Log-probs and top-k of every row, as `ModelRunner.score` gives them, computing each shared prefix once."""
        results: list[ScoredRow | None] = [None] * len(rows)
        todo = list(range(len(rows)))
        while todo:
            items = []
            for i in todo:
                match = self.cache.match(rows[i], top_k)
                if match.length == len(rows[i]):
                    results[i] = self._from_cache(rows[i], match, top_k)
                else:
                    items.append(_Item(i, rows[i], match, max(0, match.length - 1)))
            now, todo = _first_of_each_shared_run(items)
            for group in _by_computed_length(now):
                for item, row in zip(group, self._forward(group, top_k), strict=True):
                    results[item.index] = row
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _from_cache(self, tokens: list[int], match: Match, k: int) -> ScoredRow:
        incoming, top_ids, top_logprobs = match.outputs(len(tokens), k)
        return ScoredRow(incoming[1:], top_ids, top_logprobs)

    def _forward(self, items: list[_Item], k: int) -> list[ScoredRow]:
        import torch
        from megatron.core.inference.contexts import StaticInferenceContext

        runner = self.runner
        device = runner.device
        rows = len(items)
        for item in items:  # an earlier forward's rows may have cached (or split, or evicted) part of these
            item.match = self.cache.match(item.tokens, k)
            item.reuse = max(0, min(item.match.length, len(item.tokens)) - 1)
        cached = max(item.reuse for item in items)  # M: the fed tokens start at this slot
        fed = max(item.computed for item in items)
        slots = cached + fed
        layers, _, groups = runner._shape
        dtype = next(runner.model.parameters()).dtype
        # zeros, not empty: a masked slot's value still multiplies a zero probability (NaN * 0 is NaN)
        keys = torch.zeros(layers, slots, rows, groups, runner._kv_channels, dtype=dtype, device=device)
        values = torch.zeros_like(keys)
        for row, item in enumerate(items):
            at = cached - item.reuse
            for k_part, v_part in item.match.kv_segments(item.reuse):
                n = k_part.shape[1]
                keys[:, at : at + n, row] = k_part
                values[:, at : at + n, row] = v_part
                at += n
        context = StaticInferenceContext(max_batch_size=rows, max_sequence_length=slots)
        context.materialize_only_last_token_logits = False
        context.key_value_memory_dict = {number: (keys[i], values[i]) for i, number in enumerate(self._layer_numbers)}
        context.sequence_len_offset = cached

        ids = torch.zeros(rows, fed, dtype=torch.long)
        next_ids = torch.zeros(rows, fed, dtype=torch.long)
        for row, item in enumerate(items):
            part = item.tokens[item.reuse :]
            ids[row, : len(part)] = torch.tensor(part)
            if len(part) > 1:
                next_ids[row, : len(part) - 1] = torch.tensor(part[1:])
        reuse = torch.tensor([item.reuse for item in items])
        positions = (reuse[:, None] + torch.arange(fed)[None, :]).clamp_(max=runner.max_context - 1)
        key_slot = torch.arange(slots)[None, None, None, :]
        query_slot = (cached + torch.arange(fed))[None, None, :, None]
        mask = (key_slot > query_slot) | (key_slot < (cached - reuse)[:, None, None, None])
        with torch.inference_mode():
            logits = runner.model(
                input_ids=ids.to(device),
                position_ids=positions.to(device),
                attention_mask=mask.to(device),
                inference_context=context,
                runtime_gather_output=True,
            )
            logits = logits[..., : runner.vocab_limit].float()
            # as launch_scores: the same subtraction for the target and the top-k (is_greedy compares them)
            norm = torch.cat([row.logsumexp(-1, keepdim=True)[None] for row in logits])
            target = logits.gather(-1, next_ids.to(device)[..., None]).sub_(norm).squeeze(-1)
            top_values, top_ids = logits.topk(k, dim=-1)
            top_values.sub_(norm)
        self.forwards += 1
        target_l, top_ids_l, top_values_l = target.cpu().tolist(), top_ids.cpu().tolist(), top_values.cpu().tolist()

        scored = []
        for row, item in enumerate(items):
            n, reuse_i, known = len(item.tokens), item.reuse, item.match.length
            m = n - reuse_i  # fed positions reuse_i .. n-1
            # incoming[p] for p in reuse_i+1 .. n-1 is target[p-1-reuse_i]; top for p in reuse_i .. n-1
            computed_in = target_l[row][: m - 1]
            computed_ids = top_ids_l[row][:m]
            computed_top = top_values_l[row][:m]
            if reuse_i:
                incoming, ids_before, top_before = item.match.outputs(reuse_i + 1, k)
                token_logprobs = incoming[1:] + computed_in
                ids_all, top_all = ids_before[:reuse_i] + computed_ids, top_before[:reuse_i] + computed_top
            else:
                token_logprobs, ids_all, top_all = computed_in, computed_ids, computed_top
            scored.append(ScoredRow(token_logprobs, ids_all, top_all))
            self.computed_tokens += m
        # inserting splits nodes of the other rows' matches: only once every row has read its own
        for row, item in enumerate(items):
            n, reuse_i, known = len(item.tokens), item.reuse, item.match.length
            m = n - reuse_i
            # cache tokens[known:]: incoming for p >= known (known >= 1) is target[p-1-reuse_i]
            start = cached - reuse_i + known
            first_in = [float("nan")] if known == 0 else []
            self.cache.insert(
                item.tokens,
                known,
                keys[:, start : cached - reuse_i + n, row],
                values[:, start : cached - reuse_i + n, row],
                first_in + target_l[row][max(0, known - 1 - reuse_i) : m - 1],
                top_ids_l[row][known - reuse_i : m],
                top_values_l[row][known - reuse_i : m],
            )
        context.key_value_memory_dict.clear()
        return scored


def _first_of_each_shared_run(items: list[_Item]) -> tuple[list[_Item], list[int]]:
    """(rows to compute now, indices of rows that wait for a prefix one of those computes)."""
    now: list[_Item] = []
    later: list[int] = []
    first: _Item | None = None
    for item in sorted(items, key=lambda it: it.tokens):
        shared = common_prefix_length(first.tokens, item.tokens) if first is not None else 0
        if first is not None and shared >= item.match.length + MIN_SHARED_TOKENS:
            later.append(item.index)
        else:
            first = item
            now.append(item)
    return now, later


def _by_computed_length(items: list[_Item]) -> list[list[_Item]]:
    groups: list[list[_Item]] = []
    for item in sorted(items, key=lambda it: it.computed):
        if groups and item.computed <= LENGTH_RATIO * groups[-1][0].computed + LENGTH_SLACK:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def memory_per_token(runner: Any) -> int:
    """Bytes of KV one token takes over all layers (keys and values)."""
    layers, _, groups = runner._shape
    return 2 * layers * groups * runner._kv_channels * runner._element_bytes
