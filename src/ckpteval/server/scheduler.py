"""The model thread: batches concurrent requests and hands results back to the event loop.

HTTP handlers (on the asyncio loop) submit jobs; one thread owns the model and runs, in turn, a
scoring forward over waiting score jobs and one decode step of the running generation batch, so
loglikelihood requests are never stuck behind a long generation.

Scoring batches are formed by budgets, not by halves of the queue: up to `max_batch_size` rows,
`max_batch_tokens` padded tokens and `max_batch_memory` bytes of working memory, taken oldest
first from the rows whose lengths lie within `bucket_ratio` of each other (so padding stays
bounded: lm-eval sends the longest first, so neighbours are alike). When fewer rows are waiting
than are expected (those still queued when the last batch was delivered, plus the clients of that
batch, who send their next request as soon as they read their answer), the thread waits a short
while for them: at most `gather_fraction` of the last forward's duration. A single client never
waits. On a GPU the next batch is launched before the previous one is collected
(double-buffering: the kernels of one batch run while the host turns the other into responses).

Generation is continuously batched: rows that arrive while a batch is generating run their
prompt forward and join the running batch at its next decode step; finished rows leave it at
once (`GenerationBatch.join`). One decode step serves every running row.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ckpteval.server.engine import Generation, GenerationBatch, ModelRunner, PendingScores, SamplingParams, ScoredRow
from ckpteval.server.prefix_cache import common_prefix_length
from ckpteval.server.prefix_scoring import LENGTH_RATIO, LENGTH_SLACK, MIN_SHARED_TOKENS


@dataclass
class ScoreJob:
    """Score one token sequence (log-probs of every next token, top `top_k`)."""

    tokens: list[int]
    top_k: int
    future: asyncio.Future[ScoredRow]
    loop: asyncio.AbstractEventLoop


@dataclass
class GenerateJob:
    """Generate from one prompt."""

    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future[Generation]
    loop: asyncio.AbstractEventLoop


@dataclass
class SchedulerStats:
    """Counters exposed on /v1/stats (tests and benchmarks read them)."""

    score_forwards: int = 0
    score_rows: int = 0
    score_tokens: int = 0  # real tokens scored
    score_padded_tokens: int = 0  # rows x longest row, summed over forwards
    generation_batches: int = 0  # prompt forwards (each starts rows or joins them to the running batch)
    generation_rows: int = 0
    generation_joins: int = 0  # prompt forwards whose rows joined a batch that was already generating
    generation_steps: int = 0  # decode steps of the running batch
    generated_tokens: int = 0
    max_score_batch: int = 0
    max_generation_batch: int = 0  # most rows decoded in one step
    # every prompt (scored sequences and generation prompts): its tokens, those the model computed, and
    # those the prefix cache served (prompt = computed + cached)
    prompt_tokens: int = 0
    computed_tokens: int = 0
    cached_tokens: int = 0
    model_seconds: float = 0.0  # the model thread's time in forwards (scoring, prompts, decode steps)

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)

    def count_prompts(self, prompt: int, computed: int) -> None:
        self.prompt_tokens += prompt
        self.computed_tokens += computed
        self.cached_tokens += prompt - computed


def _waits_for_shared_prefix(prompt: list[int], jobs: list[GenerateJob], cache: Any) -> bool:
    """Whether `prompt` shares with a prompt of `jobs` at least `MIN_SHARED_TOKENS` more than the cache holds (and
    more than all but its last token, whose logits it needs anyway): its prefill then starts from that prefix."""
    shared = max(common_prefix_length(prompt, job.prompt) for job in jobs)
    cached = cache.match(prompt, 0).length
    return min(shared, len(prompt) - 1) >= cached + MIN_SHARED_TOKENS or (
        shared >= len(prompt) and cached < len(prompt) - 1
    )


def _fed_alike(prompt: list[int], first: list[int], cache: Any) -> bool:
    """Whether the uncached parts of two prompts are alike in length (as `prefix_scoring` groups rows): in one
    prompt forward the shorter would recompute cached tokens up to the longer's length."""
    a, b = (len(p) - min(cache.match(p, 0).length, len(p) - 1) for p in (prompt, first))
    low, high = min(a, b), max(a, b)
    return high <= LENGTH_RATIO * low + LENGTH_SLACK


def _deliver(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the client went away and the handler was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _deliver_all(results: list[tuple[ScoreJob, ScoredRow]]) -> None:
    """One wake-up of each event loop for a whole batch, not one per request."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
    for job, row in results:
        by_loop.setdefault(job.loop, []).append((job.future, row))
    for loop, items in by_loop.items():
        loop.call_soon_threadsafe(_deliver_each, items)


def _deliver_each(items: list[tuple[asyncio.Future[Any], Any]]) -> None:
    for future, result in items:
        _deliver(future, result, None)


def _fail(jobs: list[Any], error: BaseException) -> None:
    for job in jobs:
        if not job.loop.is_closed():
            job.loop.call_soon_threadsafe(_deliver, job.future, None, error)


@dataclass
class _InFlight:
    """A scoring batch launched and not yet collected."""

    jobs: list[ScoreJob]
    pending: PendingScores
    started: float


@dataclass
class Scheduler:
    """Owns the model thread. `submit()` from the event loop; results arrive on the jobs' futures."""

    runner: ModelRunner
    max_batch_size: int = 16
    # Padded tokens (rows x longest row) one scoring forward may take; a single request always runs.
    max_batch_tokens: int = 32768
    # Working memory one forward may take beyond the weights (logits, attention scores, KV cache):
    # batches stop growing there; a single request always runs.
    max_batch_memory: int = 2 * 1024**3
    # Rows of one scoring batch are at most this many times longer than its shortest row.
    bucket_ratio: float = 1.5
    gather_fraction: float = 0.1
    min_gather_seconds: float = 0.002
    max_gather_seconds: float = 0.05
    # Launch the next scoring batch before collecting the previous one (useful where kernels run
    # asynchronously: on a GPU). None: on when the model is on a GPU.
    overlap: bool | None = None
    stats: SchedulerStats = field(default_factory=SchedulerStats)

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        self._scores: deque[ScoreJob] = deque()
        self._generations: deque[GenerateJob] = deque()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ckpteval-model", daemon=True)
        self._expected = 1  # score rows expected soon: see the module docstring
        self._last_seconds = 0.0
        self._in_flight: _InFlight | None = None
        self._running: GenerationBatch | None = None
        self._generating: dict[int, GenerateJob] = {}
        self._tags = itertools.count()
        if self.overlap is None:
            self.overlap = self.runner.device.type == "cuda"

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the thread to stop after its current forward and wait for it."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, job: ScoreJob | GenerateJob) -> None:
        with self._cond:
            if isinstance(job, ScoreJob):
                self._scores.append(job)
            else:
                self._generations.append(job)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._scores or self._generations or self._running or self._in_flight):
                    self._cond.wait()
                if self._stopping:
                    break
            if self._scores or self._in_flight is not None:
                self._run_scores()
            if self._generations and len(self._generating) < self.max_batch_size:
                self._admit_generations()
            if self._running is not None:
                self._step_generation()
        if self._in_flight is not None:
            _fail(self._in_flight.jobs, RuntimeError("the server is shutting down"))
        self._fail_waiting(RuntimeError("the server is shutting down"))

    # -- scoring --------------------------------------------------------------------------------

    def _fits(self, jobs: list[ScoreJob], candidate: ScoreJob, shortest: int, longest: int) -> bool:
        length = len(candidate.tokens)
        low, high = min(shortest, length), max(longest, length)
        if high > self.bucket_ratio * low:
            return False
        if (len(jobs) + 1) * high > self.max_batch_tokens:
            return False
        return self.runner.score_memory(len(jobs) + 1, high) <= self.max_batch_memory

    def _take_scores(self, *, wait: bool) -> list[ScoreJob]:
        """The next scoring batch (possibly empty), after waiting briefly for expected rows if `wait`."""
        want = min(self.max_batch_size, self._expected)
        window = 0.0
        if wait:
            window = self.gather_fraction * self._last_seconds
            window = min(self.max_gather_seconds, max(self.min_gather_seconds, window))
        deadline = time.monotonic() + window
        with self._cond:
            while len(self._scores) < want and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if not self._scores:
                return []
            first = self._scores.popleft()
            jobs = [first]
            shortest = longest = len(first.tokens)
            skipped: list[ScoreJob] = []
            # scan a bounded window of the queue: rows outside the bucket wait for the next batch
            scan = 4 * self.max_batch_size
            while self._scores and len(jobs) < self.max_batch_size and scan > 0:
                scan -= 1
                candidate = self._scores.popleft()
                if self._fits(jobs, candidate, shortest, longest):
                    jobs.append(candidate)
                    shortest = min(shortest, len(candidate.tokens))
                    longest = max(longest, len(candidate.tokens))
                else:
                    skipped.append(candidate)
            self._scores.extendleft(reversed(skipped))
        return jobs

    def _launch(self, jobs: list[ScoreJob]) -> _InFlight | None:
        started = time.perf_counter()
        try:
            pending = self.runner.launch_scores([j.tokens for j in jobs], top_k=max(j.top_k for j in jobs))
        except Exception as exc:  # a failed forward fails its requests, not the server
            _fail(jobs, exc)
            return None
        return _InFlight(jobs, pending, started)

    def _collect(self, flight: _InFlight) -> None:
        jobs = flight.jobs
        try:
            rows = self.runner.collect_scores(flight.pending)
        except Exception as exc:
            _fail(jobs, exc)
            return
        self._last_seconds = time.perf_counter() - flight.started
        stats = self.stats
        stats.model_seconds += self._last_seconds
        stats.score_forwards += 1
        stats.score_rows += len(jobs)
        stats.score_tokens += sum(len(j.tokens) for j in jobs)
        stats.count_prompts(sum(len(j.tokens) for j in jobs), flight.pending.computed_tokens)
        stats.score_padded_tokens += len(jobs) * max(len(j.tokens) for j in jobs)
        stats.max_score_batch = max(stats.max_score_batch, len(jobs))
        results = []
        for job, row in zip(jobs, rows, strict=True):
            if job.top_k < len(row.top_ids[0]):  # trim to what this request asked for
                row = ScoredRow(
                    row.token_logprobs,
                    [t[: job.top_k] for t in row.top_ids],
                    [t[: job.top_k] for t in row.top_logprobs],
                )
            results.append((job, row))
        with self._cond:
            # what will be waiting soon: the rows queued now, and the clients this batch answers
            self._expected = max(1, len(self._scores) + len(jobs))
        _deliver_all(results)

    def _run_scores(self) -> None:
        """Run (or, overlapping, launch) one scoring batch, and collect the one in flight."""
        # no waiting with a batch in flight or rows generating: both would idle behind the wait
        jobs = self._take_scores(wait=self._in_flight is None and self._running is None) if self._scores else []
        flight = self._launch(jobs) if jobs else None
        if self._in_flight is not None:
            self._collect(self._in_flight)
            self._in_flight = None
        if flight is None:
            return
        if self.overlap and self._scores:
            self._in_flight = flight  # collected after the next batch is launched
        else:
            self._collect(flight)

    # -- generation -----------------------------------------------------------------------------

    def _admit_generations(self) -> None:
        """Run the prompt forward of queued generations and join them to the running batch."""
        room = self.max_batch_size - len(self._generating)
        running_rows = list(self._generating.values())
        # with the prefix cache, a prompt that shares more than is cached with a prompt of this round waits for
        # the next: that prefix is then cached (the n samples of one request, repeated runs of a task, the items
        # of one few-shot prefix: one MMLU subject's questions after its 5 shots)
        cache = self.runner.prefix_scorer.cache if self.runner.prefix_scorer is not None else None
        with self._cond:
            jobs: list[GenerateJob] = []
            deferred: list[GenerateJob] = []
            while self._generations and len(jobs) < room:
                candidate = self._generations[0]
                prompt = candidate.prompt
                if cache is not None and jobs and _waits_for_shared_prefix(prompt, jobs, cache):
                    deferred.append(self._generations.popleft())
                    continue
                # the prompt forward feeds every row as many tokens as its row with the most uncached ones: a
                # prompt whose cached prefix is much longer or shorter than the first's waits for a round of its own
                if cache is not None and jobs and not _fed_alike(prompt, jobs[0].prompt, cache):
                    deferred.append(self._generations.popleft())
                    continue
                rows = [*running_rows, *jobs, candidate]
                if jobs or running_rows:
                    longest = max(len(j.prompt) for j in rows)
                    need = self.runner.generation_memory(
                        len(rows), longest, longest + max(j.params.max_tokens for j in rows)
                    )
                    if need > self.max_batch_memory:
                        break
                jobs.append(self._generations.popleft())
            self._generations.extendleft(reversed(deferred))
        if not jobs:
            return
        tags = [next(self._tags) for _ in jobs]
        started = time.perf_counter()
        try:
            batch = GenerationBatch(self.runner, [(j.prompt, j.params) for j in jobs], tags=tags)
            finished = batch.step()  # the prompt forward: every row's first token
        except Exception as exc:  # a failed batch fails its requests, not the server
            _fail(jobs, exc)
            return
        self._generating.update(zip(tags, jobs, strict=True))
        stats = self.stats
        stats.model_seconds += time.perf_counter() - started
        stats.generation_batches += 1
        stats.generation_rows += len(jobs)
        stats.count_prompts(sum(len(j.prompt) for j in jobs), batch.computed_tokens)
        self._finish(finished)
        if batch.done:
            return
        if self._running is None:
            self._running = batch
        else:
            stats.generation_joins += 1
            try:
                self._running.join(batch)
            except Exception as exc:
                self._abort_running(exc, extra=batch)

    def _step_generation(self) -> None:
        running = self._running
        assert running is not None
        started = time.perf_counter()
        try:
            finished = running.step()
        except Exception as exc:  # a failed step fails its requests, not the server
            self._abort_running(exc)
            return
        self.stats.generation_steps += 1
        self.stats.model_seconds += time.perf_counter() - started
        self.stats.max_generation_batch = max(self.stats.max_generation_batch, len(running.rows))
        self._finish(finished)
        if running.done:
            self._running = None

    def _finish(self, finished: dict[int, Generation]) -> None:
        for tag, result in finished.items():
            self.stats.generated_tokens += result.num_generated
            job = self._generating.pop(tag)
            job.loop.call_soon_threadsafe(_deliver, job.future, result, None)

    def _abort_running(self, error: BaseException, extra: GenerationBatch | None = None) -> None:
        rows = [*(self._running.rows if self._running else []), *(extra.rows if extra else [])]
        _fail([self._generating.pop(r.index) for r in rows if r.index in self._generating], error)
        self._running = None

    def _fail_waiting(self, error: BaseException) -> None:
        with self._cond:
            waiting: list[Any] = [*self._generating.values(), *self._scores, *self._generations]
            self._generating.clear()
            self._scores.clear()
            self._generations.clear()
        _fail(waiting, error)
