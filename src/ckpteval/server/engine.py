"""The model's two kinds of work: scoring token sequences and generating with a KV cache.

Scoring runs one causal forward over right-padded rows and returns, for every position, the
log-probability of the next token and the top-k alternatives (what `echo` + `logprobs` needs).

Generation batches rows of different prompt lengths by left-padding them into one megatron
`StaticInferenceContext`: the prompt forward fills the KV cache, then each step feeds one token
per row. Padded keys are masked in every step; megatron stores keys before rotating them and
rotates the whole cache by slot, so with rotary embeddings a left-padded row attends exactly as an
unpadded one (attention depends only on relative positions). Rows that finish are dropped from
the batch and their cache rows with them, and rows that arrive later join a running batch at its
next step (`GenerationBatch.join`: continuous batching).

Everything here runs on the one model thread (see `scheduler`); nothing is thread-safe.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckpteval.server.scores import ScoredRow

if TYPE_CHECKING:
    import torch

    from ckpteval.server.tokenizer import ServedTokenizer


@dataclass(frozen=True)
class SamplingParams:
    """How one row is generated. temperature 0 is greedy."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # top alternatives per generated token; None: no log-probs


@dataclass
class Generation:
    """The result of generating one row."""

    token_ids: list[int]  # generated tokens, without a final end-of-sequence token
    text: str  # their text, cut before a stop sequence
    finish_reason: str  # "stop" (EOS or a stop sequence) or "length"
    num_generated: int  # tokens the model produced, counting a final EOS (usage accounting)
    token_logprobs: list[float] | None = None
    top: list[list[tuple[int, float]]] | None = None


@dataclass
class PendingScores:
    """A scoring forward that was launched and not yet collected."""

    rows: list[list[int]]
    outputs: tuple[Any, Any, Any] | None  # target log-probs, top ids, top log-probs
    event: Any  # a torch.cuda.Event on a GPU, else None
    scored: list[ScoredRow] | None = None  # the rows themselves, when they were computed at launch
    computed_tokens: int = 0  # tokens fed through the model (less than the rows' when the prefix cache served some)


class ModelRunner:
    """Forward passes of one GPTModel on one device."""

    def __init__(self, model: Any, tokenizer: ServedTokenizer, *, device: str, max_context: int) -> None:
        import torch

        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_context = max_context
        self._causal: dict[int, torch.Tensor] = {}
        # Ids the model may emit but the tokenizer cannot decode (Megatron pads the vocabulary).
        self.vocab_limit = min(tokenizer.vocab_size, model.vocab_size)
        config = model.config
        self._shape = (
            config.num_layers,
            config.num_attention_heads,
            config.num_query_groups or config.num_attention_heads,
        )
        self._kv_channels = config.kv_channels
        self._element_bytes = next(model.parameters()).element_size()
        self.prefix_scorer: Any = None  # a prefix_scoring.PrefixScorer once `enable_prefix_cache` ran

    def enable_prefix_cache(self, budget_bytes: int) -> None:
        """Score through a prefix cache of at most `budget_bytes` (see `prefix_cache`)."""
        from ckpteval.server.prefix_cache import PrefixCache
        from ckpteval.server.prefix_scoring import PrefixScorer, memory_per_token

        cache = PrefixCache(budget_bytes, kv_bytes_per_token=memory_per_token(self))
        self.prefix_scorer = PrefixScorer(self, cache)

    def score_memory(self, rows: int, length: int) -> int:
        """Bytes a scoring forward over `rows` padded to `length` needs beyond the weights (an estimate).

        float32 logits [rows, length, vocab], and attention scores [rows, heads, length, length]
        with the copies masking and softmax make.
        """
        _, heads, _ = self._shape
        working = 4 * rows * length * (self.model.vocab_size + 3 * heads * length)
        if self.prefix_scorer is not None:  # it feeds the rows through a KV cache it assembles
            working += rows * length * self.prefix_scorer.cache.kv_bytes_per_token
        return working

    def generation_memory(self, rows: int, prompt: int, total: int) -> int:
        """Bytes a generation batch needs: its KV cache for `total` positions and the prompt forward's attention."""
        layers, heads, groups = self._shape
        cache = 2 * layers * groups * self._kv_channels * self._element_bytes * rows * total
        return cache + 4 * 3 * rows * heads * prompt * prompt

    def causal_mask(self, length: int) -> torch.Tensor:
        """[1, 1, L, L] bool, True above the diagonal (megatron masks where True)."""
        import torch

        mask = self._causal.get(length)
        if mask is None:
            mask = torch.triu(torch.ones(length, length, dtype=torch.bool, device=self.device), diagonal=1)[None, None]
            if len(self._causal) < 64:
                self._causal[length] = mask
        return mask

    def score(self, rows: list[list[int]], top_k: int = 1) -> list[ScoredRow]:
        """One forward over `rows` (right-padded); log-probs of each next token and the top-k."""
        return self.collect_scores(self.launch_scores(rows, top_k))

    def launch_scores(self, rows: list[list[int]], top_k: int = 1) -> PendingScores:
        """Start a scoring forward; `collect_scores` waits for it and turns it into rows.

        On a GPU the kernels run asynchronously: the caller can prepare (or launch) the next
        batch before collecting this one. On the CPU, and through the prefix cache, the work is done here.
        """
        import torch

        if self.prefix_scorer is not None:
            before = self.prefix_scorer.computed_tokens
            scored = self.prefix_scorer.score(rows, top_k)
            return PendingScores(rows, None, None, scored, self.prefix_scorer.computed_tokens - before)
        with torch.inference_mode():
            batch, length = len(rows), max(len(r) for r in rows)
            ids = torch.tensor([r + [0] * (length - len(r)) for r in rows], dtype=torch.long)
            ids = ids.to(self.device, non_blocking=True)
            positions = torch.arange(length, device=self.device).expand(batch, length)
            logits = self.model(input_ids=ids, position_ids=positions, attention_mask=self.causal_mask(length))
            # the tokenizer's ids only, as in generation: a checkpoint's embedding is padded (to a multiple of
            # 128 x TP) past its tokenizer, and a padding id has no text to show (vLLM drops them the same way)
            logits = logits[..., : self.vocab_limit].float()
            # log p = logit - logsumexp; the same subtraction for the target and the top-k, so a
            # greedy token's logprob equals the top value exactly (lm-eval's is_greedy compares them).
            # row by row: logsumexp's temporary is as large as its input, and [rows, length, vocab]
            # logits are the largest tensor of a scoring forward
            norm = torch.cat([row.logsumexp(-1, keepdim=True)[None] for row in logits])
            target = logits[:, :-1].gather(-1, ids[:, 1:, None]).sub_(norm[:, :-1]).squeeze(-1)
            top_values, top_ids = logits.topk(top_k, dim=-1)
            top_values.sub_(norm)
            outputs = (target, top_ids, top_values)
            if self.device.type == "cuda":  # copy out without blocking; collect waits for the event
                outputs = tuple(t.to("cpu", non_blocking=True) for t in outputs)
                event = torch.cuda.Event()
                event.record()
            else:
                event = None
        return PendingScores(rows, outputs, event, computed_tokens=sum(len(r) for r in rows))

    def collect_scores(self, pending: PendingScores) -> list[ScoredRow]:
        """The rows of a launched scoring forward (waits for the device)."""
        if pending.scored is not None:
            return pending.scored
        if pending.event is not None:
            pending.event.synchronize()
        assert pending.outputs is not None
        target, top_ids, top_values = pending.outputs
        target_l, top_ids_l, top_values_l = target.tolist(), top_ids.tolist(), top_values.tolist()
        return [
            ScoredRow(
                token_logprobs=target_l[i][: len(r) - 1],
                top_ids=top_ids_l[i][: len(r)],
                top_logprobs=top_values_l[i][: len(r)],
            )
            for i, r in enumerate(pending.rows)
        ]

    def generate(self, requests: list[tuple[list[int], SamplingParams]]) -> list[Generation]:
        """Generate every request to completion (a convenience over `GenerationBatch`)."""
        batch = GenerationBatch(self, requests)
        results: dict[int, Generation] = {}
        while not batch.done:
            results.update(batch.step())
        return [results[i] for i in range(len(requests))]

    def generate_without_cache(self, prompt: list[int], params: SamplingParams) -> Generation:
        """Greedy generation recomputing the whole prefix every step (the baseline the cache is measured against)."""
        out: list[int] = []
        for _ in range(params.max_tokens):
            scored = self.score([prompt + out], top_k=1)[0]
            token = scored.top_ids[-1][0]
            if token in self.tokenizer.stop_token_ids:
                return Generation(out, self.tokenizer.decode(out), "stop", len(out) + 1)
            out.append(token)
        return Generation(out, self.tokenizer.decode(out), "length", len(out))


@dataclass
class _Row:
    index: int
    params: SamplingParams
    generator: Any = None
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""


class GenerationBatch:
    """Rows generated together with one KV cache; `step()` advances every row by one token."""

    def __init__(
        self,
        runner: ModelRunner,
        requests: list[tuple[list[int], SamplingParams]],
        *,
        tags: list[int] | None = None,
    ) -> None:
        """`tags` name the rows in what `step()` returns (default: their positions in `requests`)."""
        import torch
        from megatron.core.inference.contexts import StaticInferenceContext

        self.runner = runner
        device = runner.device
        longest = max(len(prompt) for prompt, _ in requests)
        new_tokens = max(p.max_tokens for _, p in requests)
        # Not capped at the model's context: each row's own prompt + max_tokens was checked against
        # it; a short row left-padded beside a long one only uses later cache slots, and its
        # positions (slot - padding) stay within the context.
        capacity = longest + new_tokens
        self.rows = []
        for i, (_, params) in enumerate(requests):
            generator = None
            if params.temperature > 0:
                generator = torch.Generator(device=device)
                generator.manual_seed(params.seed if params.seed is not None else int(time.time_ns() % 2**63))
            self.rows.append(_Row(index=tags[i] if tags else i, params=params, generator=generator))
        batch = len(requests)
        self.pads = torch.tensor([longest - len(p) for p, _ in requests], device=device)
        self.key_padding = torch.arange(capacity, device=device)[None, :] < self.pads[:, None]  # True = masked
        self.next_input = torch.tensor(
            [[0] * (longest - len(p)) + p for p, _ in requests], dtype=torch.long, device=device
        )
        self.context = StaticInferenceContext(max_batch_size=batch, max_sequence_length=capacity)
        self.capacity = capacity
        self.steps = 0
        self.done = False
        prompts = [p for p, _ in requests]
        self.computed_tokens = sum(len(p) for p in prompts)  # prompt tokens the first step feeds (unpadded)
        self._to_cache: list[tuple[list[int], int]] = []  # (prompt, tokens of it already cached) per row
        if runner.prefix_scorer is not None:
            self._start_from_cache(prompts, runner.prefix_scorer.cache)

    def _start_from_cache(self, prompts: list[list[int]], cache: Any) -> None:
        """Put the cached part of each prompt into the KV cache; the prompt step feeds only the rest.

        Row i's prompt fills slots [pad_i, longest). Its first `reuse_i` tokens (all but at least the last,
        whose logits give the first new token) come from the prefix cache; the step feeds every row from
        the first slot some row does not have, so a row may recompute a few cached tokens (the same KV).
        """
        import torch

        runner = self.runner
        longest = self.next_input.shape[1]
        matches = [cache.match(p, 0) for p in prompts]
        reuse = [min(m.length, len(p) - 1) for m, p in zip(matches, prompts, strict=True)]
        self._to_cache = [(p, m.length) for p, m in zip(prompts, matches, strict=True)]
        fed = max(len(p) - r for p, r in zip(prompts, reuse, strict=True))
        if fed == longest:
            return
        layers, _, groups = runner._shape
        dtype = next(runner.model.parameters()).dtype
        shape = (layers, self.capacity, len(prompts), groups, runner._kv_channels)
        keys = torch.zeros(shape, dtype=dtype, device=runner.device)
        values = torch.zeros_like(keys)
        pads = self.pads.tolist()
        for row, (match, count) in enumerate(zip(matches, reuse, strict=True)):
            at = pads[row]
            for k_part, v_part in match.kv_segments(count):
                n = k_part.shape[1]
                keys[:, at : at + n, row] = k_part
                values[:, at : at + n, row] = v_part
                at += n
        numbers = [layer.self_attention.layer_number for layer in runner.model.decoder.layers]
        self.context.key_value_memory_dict = {n: (keys[i], values[i]) for i, n in enumerate(numbers)}
        self.context.sequence_len_offset = longest - fed
        self.next_input = self.next_input[:, longest - fed :]
        self.computed_tokens = sum(min(len(p), fed) for p in prompts)

    def _cache_prompts(self) -> None:
        """After the prompt step: every prompt's KV into the prefix cache (without scores: k = 0)."""
        import torch

        cache = self.runner.prefix_scorer.cache
        memory = self.context.key_value_memory_dict
        longest = int(self.context.sequence_len_offset)
        pads = self.pads.tolist()
        for row, (prompt, known) in enumerate(self._to_cache):
            if known >= len(prompt):
                continue
            first = pads[row] + known
            keys = torch.stack([k[first:longest, row] for k, _ in memory.values()])
            values = torch.stack([v[first:longest, row] for _, v in memory.values()])
            new = len(prompt) - known
            cache.insert(prompt, known, keys, values, [float("nan")] * new, [[]] * new, [[]] * new)
        self._to_cache = []

    def step(self) -> dict[int, Generation]:
        """Run one forward (the prompts first, then one token per row); return the rows that finished."""
        import torch

        runner, ctx = self.runner, self.context
        with torch.inference_mode():
            start, width = ctx.sequence_len_offset, self.next_input.shape[1]
            keys = self.key_padding[:, None, None, : start + width]
            if start == 0:
                mask = keys | runner.causal_mask(width)
            elif width > 1:  # a prompt step after cached tokens: causal over the fed part
                key_slot = torch.arange(start + width, device=runner.device)[None, :]
                mask = keys | (key_slot > torch.arange(start, start + width, device=runner.device)[:, None])
            else:
                mask = keys
            positions = (torch.arange(start, start + width, device=runner.device)[None, :] - self.pads[:, None]).clamp_(
                min=0
            )
            logits = runner.model(
                input_ids=self.next_input,
                position_ids=positions,
                attention_mask=mask,
                inference_context=ctx,
                runtime_gather_output=True,
            )
            ctx.increment_sequence_len_offset(width)
            self.steps += 1
            if self._to_cache:
                self._cache_prompts()
            logits = logits[:, -1, : runner.vocab_limit].float()
            tokens = self._sample(logits)
            want_logprobs = [r.params.logprobs is not None for r in self.rows]
            logprobs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None
            token_list = tokens.tolist()

            finished: dict[int, Generation] = {}
            keep: list[int] = []
            for slot, (row, token) in enumerate(zip(self.rows, token_list, strict=True)):
                if logprobs is not None and want_logprobs[slot]:
                    k = max(1, row.params.logprobs or 0)
                    values, ids = logprobs[slot].topk(k)
                    row.logprobs.append(float(logprobs[slot, token]))
                    row.top.append(list(zip(ids.tolist(), values.tolist(), strict=True)))
                result = self._advance(row, token, full=start + width >= self.capacity)
                if result is None:
                    keep.append(slot)
                else:
                    finished[row.index] = result
            if not keep:
                self.done = True
                ctx.key_value_memory_dict.clear()
                return finished
            self.next_input = tokens[:, None]
            if len(keep) < len(self.rows):
                self._drop_rows(keep)
                self._trim_front()
        return finished

    @property
    def offset(self) -> int:
        """Cache slots filled so far (the next step writes slot `offset`)."""
        return int(self.context.sequence_len_offset)

    def join(self, other: GenerationBatch) -> None:
        """Take over the rows of `other`, whose prompt step has run: they decode with these from the next step.

        The two caches are aligned at their current slot: the batch at the lower slot is shifted right
        by left-padding (masked keys) so that both write their next token into the same slot. Keys are
        stored unrotated and rotated by slot, so a uniform shift changes no row's relative positions.
        """
        import torch

        assert not self.done and not other.done and self.steps and other.steps, "join two running batches"
        shift = other.offset - self.offset
        if shift > 0:
            self._shift_right(shift)
        elif shift < 0:
            other._shift_right(-shift)
        capacity = max(self.capacity, other.capacity)
        self._grow(capacity)
        other._grow(capacity)
        mine, theirs = self.context.key_value_memory_dict, other.context.key_value_memory_dict
        for layer, (k, v) in mine.items():
            k2, v2 = theirs[layer]
            mine[layer] = (torch.cat([k, k2], dim=1), torch.cat([v, v2], dim=1))
        theirs.clear()
        other.done = True
        self.rows += other.rows
        self.pads = torch.cat([self.pads, other.pads])
        self.key_padding = torch.cat([self.key_padding, other.key_padding])
        self.next_input = torch.cat([self.next_input, other.next_input])
        self.context.max_batch_size = len(self.rows)

    def _shift_right(self, slots: int) -> None:
        """Prepend `slots` masked cache slots to every row."""
        import torch

        memory = self.context.key_value_memory_dict
        for layer, (k, v) in memory.items():
            pad = k.new_zeros((slots, *k.shape[1:]))
            memory[layer] = (torch.cat([pad, k]), torch.cat([pad, v]))
        self.pads = self.pads + slots
        masked = torch.ones(len(self.rows), slots, dtype=torch.bool, device=self.key_padding.device)
        self.key_padding = torch.cat([masked, self.key_padding], dim=1)
        self.context.sequence_len_offset += slots
        self.capacity += slots
        self.context.max_sequence_length = self.capacity

    def _grow(self, capacity: int) -> None:
        """Make room for `capacity` cache slots."""
        import torch

        extra = capacity - self.capacity
        if extra <= 0:
            return
        memory = self.context.key_value_memory_dict
        for layer, (k, v) in memory.items():
            pad = k.new_zeros((extra, *k.shape[1:]))
            memory[layer] = (torch.cat([k, pad]), torch.cat([v, pad]))
        free = torch.zeros(len(self.rows), extra, dtype=torch.bool, device=self.key_padding.device)
        self.key_padding = torch.cat([self.key_padding, free], dim=1)
        self.capacity = capacity
        self.context.max_sequence_length = capacity

    def _trim_front(self) -> None:
        """Drop leading cache slots that every row masks (rows that joined late padded them).

        Without this a batch fed new rows forever would grow its cache, and every step's attention,
        without bound. Trimmed only when it pays: a quarter of the cache or more.
        """
        unused = int(self.pads.min())
        if unused == 0 or unused * 4 < self.offset:
            return
        memory = self.context.key_value_memory_dict
        for layer, (k, v) in memory.items():
            memory[layer] = (k[unused:].contiguous(), v[unused:].contiguous())
        self.pads = self.pads - unused
        self.key_padding = self.key_padding[:, unused:]
        self.context.sequence_len_offset -= unused
        self.capacity -= unused
        self.context.max_sequence_length = self.capacity

    def _advance(self, row: _Row, token: int, *, full: bool) -> Generation | None:
        tokenizer = self.runner.tokenizer
        params = row.params
        if token in tokenizer.stop_token_ids:
            if row.logprobs and params.logprobs is not None:  # the EOS is not part of the returned tokens
                row.logprobs.pop()
                row.top.pop()
            return self._finish(row, "stop", eos=True)
        row.out.append(token)
        if params.stop:
            # A stop sequence that just completed ends in this token, so it lies within the last few
            # tokens (a character takes at most 4); decode only those, and the whole text on a hit.
            window = 4 * max(len(s) for s in params.stop) + 4
            tail = tokenizer.decode(row.out[-window:])
            if any(s in tail for s in params.stop):
                text = tokenizer.decode(row.out)
                cut = min((i for i in (text.find(s) for s in params.stop) if i >= 0), default=-1)
                if cut >= 0:
                    row.text = text[:cut]
                    return self._finish(row, "stop", text_done=True)
        if len(row.out) >= params.max_tokens or full:
            return self._finish(row, "length")
        return None

    def _finish(self, row: _Row, reason: str, *, eos: bool = False, text_done: bool = False) -> Generation:
        text = row.text if text_done else self.runner.tokenizer.decode(row.out)
        with_logprobs = row.params.logprobs is not None
        return Generation(
            token_ids=row.out,
            text=text,
            finish_reason=reason,
            num_generated=len(row.out) + (1 if eos else 0),
            token_logprobs=row.logprobs if with_logprobs else None,
            top=row.top if with_logprobs else None,
        )

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        import torch

        tokens = logits.argmax(dim=-1)
        for slot, row in enumerate(self.rows):
            p = row.params
            if p.temperature <= 0 or p.top_k == 1:
                continue
            scaled = logits[slot] / p.temperature
            if p.top_k > 1:
                kth = scaled.topk(min(p.top_k, scaled.numel())).values[-1]
                scaled = scaled.masked_fill(scaled < kth, float("-inf"))
            probs = torch.softmax(scaled, dim=-1)
            if p.top_p < 1.0:
                sorted_probs, order = probs.sort(descending=True)
                # keep the smallest prefix whose mass reaches top_p (always at least one token)
                drop = sorted_probs.cumsum(0) - sorted_probs >= p.top_p
                sorted_probs[drop] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            tokens[slot] = torch.multinomial(probs, 1, generator=row.generator)[0]
        return tokens

    def _drop_rows(self, keep: list[int]) -> None:
        import torch

        index = torch.tensor(keep, device=self.runner.device)
        self.rows = [self.rows[i] for i in keep]
        self.pads = self.pads[index]
        self.key_padding = self.key_padding[index]
        self.next_input = self.next_input[index]
        memory = self.context.key_value_memory_dict
        for layer, (k, v) in memory.items():
            memory[layer] = (k[:, index].contiguous(), v[:, index].contiguous())
