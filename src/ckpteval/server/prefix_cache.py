"""The prefix cache: a token tree of sequences the model has scored, each token's KV and its log-probs.

A node holds a run of tokens (a radix tree: a chain without branches is one node) and, for each of its
tokens, what a scoring forward computed there:
- the keys and values of every layer (`keys`/`values`: [layers, tokens, groups, channels]; megatron
  stores keys before rotating them, so a cached prefix can be placed at any cache slot);
- the log-probability of that token given everything before it (`incoming`; the root's first token has
  none);
- the top-k next tokens after it, with their log-probabilities (`top_ids`/`top_logprobs`, `k` of them).

A request whose first m tokens are in the tree reuses the KV of its first m - 1 and computes from token
m - 1 on: the log-probability of token m needs the logits at m - 1, which the tree does not keep (only
their top-k). A request entirely in the tree is answered from it.

Memory: every node's bytes count against `budget_bytes`; inserting evicts least-recently-used leaves
until the new tokens fit, and a sequence larger than the whole budget is not cached. Everything here
runs on the model thread (see `scheduler`); nothing is thread-safe.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Python objects per cached token (a float, a list of k ints and k floats): an estimate, counted with the KV
_OUTPUT_BYTES_PER_TOKEN = 120
_OUTPUT_BYTES_PER_TOP = 60


@dataclass
class _Node:
    tokens: list[int]
    keys: Any  # torch.Tensor [layers, len(tokens), groups, channels]; None at the root
    values: Any
    incoming: list[float]  # log p(tokens[i] | everything before it); NaN for the first token of a sequence
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
    k: int
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    used: int = 0  # LRU clock
    nbytes: int = 0


@dataclass
class Match:
    """The longest cached prefix of a sequence: `length` tokens along `path` (root's children first)."""

    length: int
    path: list[_Node]

    def kv_segments(self, count: int) -> list[tuple[Any, Any]]:
        """(keys, values) of the first `count` cached tokens, node by node ([layers, n, groups, channels])."""
        out = []
        for node in self.path:
            if count <= 0:
                break
            take = min(count, len(node.tokens))
            out.append((node.keys[:, :take], node.values[:, :take]))
            count -= take
        return out

    def outputs(self, count: int, k: int) -> tuple[list[float], list[list[int]], list[list[float]]]:
        """(incoming, top ids, top log-probs) of the first `count` cached tokens, trimmed to `k` alternatives."""
        incoming: list[float] = []
        top_ids: list[list[int]] = []
        top_logprobs: list[list[float]] = []
        for node in self.path:
            if len(incoming) >= count:
                break
            take = min(count - len(incoming), len(node.tokens))
            incoming += node.incoming[:take]
            if node.k == k:
                top_ids += node.top_ids[:take]
                top_logprobs += node.top_logprobs[:take]
            else:
                top_ids += [t[:k] for t in node.top_ids[:take]]
                top_logprobs += [t[:k] for t in node.top_logprobs[:take]]
        return incoming, top_ids, top_logprobs


@dataclass
class PrefixCacheStats:
    """What the cache holds (for /v1/stats)."""

    cache_bytes: int = 0  # held now
    peak_cache_bytes: int = 0
    evicted_tokens: int = 0


def default_budget_mib() -> int:
    """The cache's budget when none is set: an eighth of the memory available now, from 256 MiB to 4 GiB.

    With the harness's requests in prefix order (`ckpteval_request_order`) the cache needs only the prefix
    being worked through (an MMLU subject's 5 shots: ~500 tokens, ~23 MiB for SmolLM2-135M); the rest is
    headroom for clients that send in another order (57 MMLU subjects' prefixes: ~30k tokens, ~1.3 GiB).
    """
    import psutil

    available = psutil.virtual_memory().available // 1024**2
    return max(256, min(4096, available // 8))


class PrefixCache:
    """A token tree of scored sequences under a memory budget, least recently used evicted first."""

    def __init__(self, budget_bytes: int, *, kv_bytes_per_token: int) -> None:
        self.budget_bytes = budget_bytes
        self.kv_bytes_per_token = kv_bytes_per_token
        self.root = _Node([], None, None, [], [], [], 0, None)
        self.stats = PrefixCacheStats()
        self._clock = itertools.count(1)

    def token_bytes(self, k: int) -> int:
        """What one cached token costs, its KV and its scores with `k` alternatives."""
        return self.kv_bytes_per_token + _OUTPUT_BYTES_PER_TOKEN + _OUTPUT_BYTES_PER_TOP * k

    def match(self, tokens: list[int], k: int = 1) -> Match:
        """The longest prefix of `tokens` in the tree whose nodes keep at least `k` alternatives; marks it used."""
        node, length, path = self.root, 0, []
        now = next(self._clock)
        while length < len(tokens):
            child = node.children.get(tokens[length])
            if child is None or child.k < k:
                break
            same = _common_length(child.tokens, tokens, length)
            child.used = now
            path.append(child)
            length += same
            if same < len(child.tokens):
                break
            node = child
        return Match(length, path)

    def insert(
        self,
        tokens: list[int],
        start: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        incoming: list[float],
        top_ids: list[list[int]],
        top_logprobs: list[list[float]],
    ) -> bool:
        """Cache tokens[start:] (their KV [layers, n, groups, channels] and scores) after the cached tokens[:start].

        `start` is the length `match` returned for these tokens before they were computed. Returns False when
        they are not cached: part of tokens[:start] was evicted since, or they do not fit the budget even
        after evicting every other least-recently-used leaf.
        """
        k = len(top_ids[0]) if top_ids else 1
        # rows of one forward may have cached part of these tokens meanwhile: add only what is still missing
        now = self.match(tokens, k).length
        if now >= len(tokens):
            return True
        if now < start:
            return False  # part of the prefix these scores continue was evicted since
        parent = self._split_at(tokens, now)
        if parent is None or tokens[now] in parent.children:
            return False  # a node with fewer alternatives holds the next token
        skip = now - start
        nbytes = (len(tokens) - now) * self.token_bytes(k)
        if nbytes > self.budget_bytes or not self._make_room(nbytes, _ancestors(parent)):
            return False
        node = _Node(
            tokens=tokens[now:],
            keys=keys[:, skip:].clone(),  # its own storage: a view would keep the whole batch's cache alive
            values=values[:, skip:].clone(),
            incoming=incoming[skip:],
            top_ids=top_ids[skip:],
            top_logprobs=top_logprobs[skip:],
            k=k,
            parent=parent,
            used=next(self._clock),
            nbytes=nbytes,
        )
        parent.children[tokens[now]] = node
        self._account(nbytes)
        return True

    def _split_at(self, tokens: list[int], start: int) -> _Node | None:
        """The node whose last token is tokens[start - 1], splitting one if `start` falls inside it."""
        node, length = self.root, 0
        while length < start:
            child = node.children.get(tokens[length])
            if child is None:
                return None
            end = length + len(child.tokens)
            if end > start:
                self._split(child, start - length)
                return child
            node, length = child, end
        return node

    def _split(self, node: _Node, at: int) -> None:
        """Cut `node` after its first `at` tokens; the rest becomes its only child."""
        tail = _Node(
            tokens=node.tokens[at:],
            keys=node.keys[:, at:].clone(),
            values=node.values[:, at:].clone(),
            incoming=node.incoming[at:],
            top_ids=node.top_ids[at:],
            top_logprobs=node.top_logprobs[at:],
            k=node.k,
            parent=node,
            children=node.children,
            used=node.used,
        )
        for child in tail.children.values():
            child.parent = tail
        tail.nbytes = len(tail.tokens) * self.token_bytes(node.k)
        node.nbytes -= tail.nbytes
        node.tokens = node.tokens[:at]
        node.keys = node.keys[:, :at].clone()
        node.values = node.values[:, :at].clone()
        node.incoming = node.incoming[:at]
        node.top_ids = node.top_ids[:at]
        node.top_logprobs = node.top_logprobs[:at]
        node.children = {tail.tokens[0]: tail}

    def _make_room(self, nbytes: int, protected: set[int]) -> bool:
        while self.stats.cache_bytes + nbytes > self.budget_bytes:
            leaves = [n for n in _walk(self.root) if not n.children and id(n) not in protected and n is not self.root]
            if not leaves:
                return False
            victim = min(leaves, key=lambda n: n.used)
            assert victim.parent is not None
            del victim.parent.children[victim.tokens[0]]
            self.stats.evicted_tokens += len(victim.tokens)
            self._account(-victim.nbytes)
        return True

    def _account(self, delta: int) -> None:
        self.stats.cache_bytes += delta
        self.stats.peak_cache_bytes = max(self.stats.peak_cache_bytes, self.stats.cache_bytes)

    def cached_tokens(self) -> int:
        """Tokens held in the tree now."""
        return sum(len(n.tokens) for n in _walk(self.root))


def _common_length(segment: list[int], tokens: list[int], offset: int) -> int:
    n = min(len(segment), len(tokens) - offset)
    i = 0
    while i < n and segment[i] == tokens[offset + i]:
        i += 1
    return i


def _ancestors(node: _Node | None) -> set[int]:
    out = set()
    while node is not None:
        out.add(id(node))
        node = node.parent
    return out


def _walk(root: _Node) -> list[_Node]:
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    return _common_length(a, b, 0)
