"""The model thread: batches concurrent requests and hands results back to the event loop.

HTTP handlers (on the asyncio loop) submit jobs; one thread owns the model and runs, in turn, a
scoring forward over the waiting score jobs and one step of each running generation batch, so
loglikelihood requests are never stuck behind a long generation. Generation requests that arrive
while a batch runs start a batch of their own (up to `max_batch_size` rows in all), so they do not
wait for the slowest row of the earlier one.

Batching is adaptive, with no fixed wait: the thread takes what is queued. When fewer jobs are
waiting than the previous batch held (clients are still sending their next request), it waits a
short while for them: at most `gather_fraction` of the previous forward's duration, so a single
client never waits and sixteen clients fill a batch of sixteen.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ckpteval.deploy.engine import Generation, GenerationBatch, ModelRunner, SamplingParams, ScoredRow


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
    generation_batches: int = 0
    generation_rows: int = 0
    generation_steps: int = 0
    generated_tokens: int = 0
    max_score_batch: int = 0
    max_generation_batch: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


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


@dataclass
class _RunningBatch:
    batch: GenerationBatch
    jobs: list[GenerateJob]
    started: float


@dataclass
class _Gather:
    last_size: int = 1
    last_seconds: float = 0.0


@dataclass
class Scheduler:
    """Owns the model thread. `submit()` from the event loop; results arrive on the jobs' futures."""

    runner: ModelRunner
    max_batch_size: int = 16
    # Working memory one forward may take beyond the weights (logits, attention scores, KV cache):
    # batches stop growing there; a single request always runs.
    max_batch_memory: int = 2 * 1024**3
    max_generation_batches: int = 4  # batches stepped in turn: new requests need not wait for stragglers
    gather_fraction: float = 0.1
    max_gather_seconds: float = 0.05
    stats: SchedulerStats = field(default_factory=SchedulerStats)

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        self._scores: deque[ScoreJob] = deque()
        self._generations: deque[GenerateJob] = deque()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ckpteval-model", daemon=True)
        self._score_gather = _Gather()
        self._generation_gather = _Gather()

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
        batches: list[_RunningBatch] = []
        while True:
            with self._cond:
                while not (self._stopping or self._scores or self._generations or batches):
                    self._cond.wait()
                if self._stopping:
                    break
            if self._scores:
                self._run_scores()
            active_rows = sum(len(b.batch.rows) for b in batches)
            if self._generations and active_rows < self.max_batch_size and len(batches) < self.max_generation_batches:
                # With a batch already running, start the next one from what is queued, without waiting.
                started = self._start_generation(wait=not batches, limit=self.max_batch_size - active_rows)
                if started is not None:
                    batches.append(started)
            batches = [b for b in batches if self._step_generation(b)]
        self._fail_waiting(RuntimeError("the server is shutting down"), running=[j for b in batches for j in b.jobs])

    def _take(self, queue: deque[Any], gather: _Gather, *, memory: Any, limit: int, wait: bool = True) -> list[Any]:
        """Up to `limit` queued jobs, in order, while `memory(jobs)` stays within the budget."""
        want = min(limit, gather.last_size)
        window = min(self.max_gather_seconds, self.gather_fraction * gather.last_seconds) if wait else 0.0
        deadline = time.monotonic() + window
        with self._cond:
            while len(queue) < want and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            taken: list[Any] = []
            while queue and len(taken) < limit:
                if taken and memory([*taken, queue[0]]) > self.max_batch_memory:
                    break
                taken.append(queue.popleft())
        return taken

    def _run_scores(self) -> None:
        jobs: list[ScoreJob] = self._take(
            self._scores,
            self._score_gather,
            memory=lambda jobs: self.runner.score_memory(len(jobs), max(len(j.tokens) for j in jobs)),
            limit=self.max_batch_size,
        )
        if not jobs:
            return
        started = time.perf_counter()
        try:
            rows = self.runner.score([j.tokens for j in jobs], top_k=max(j.top_k for j in jobs))
        except Exception as exc:  # a failed forward fails its requests, not the server
            for job in jobs:
                job.loop.call_soon_threadsafe(_deliver, job.future, None, exc)
            return
        self._score_gather.last_size = len(jobs)
        self._score_gather.last_seconds = time.perf_counter() - started
        self.stats.score_forwards += 1
        self.stats.score_rows += len(jobs)
        self.stats.max_score_batch = max(self.stats.max_score_batch, len(jobs))
        results = []
        for job, row in zip(jobs, rows, strict=True):
            if job.top_k < len(row.top_ids[0]):  # trim to what this request asked for
                row = ScoredRow(
                    row.token_logprobs,
                    [t[: job.top_k] for t in row.top_ids],
                    [t[: job.top_k] for t in row.top_logprobs],
                )
            results.append((job, row))
        _deliver_all(results)

    def _start_generation(self, *, wait: bool, limit: int) -> _RunningBatch | None:
        jobs: list[GenerateJob] = self._take(
            self._generations,
            self._generation_gather,
            memory=lambda jobs: self.runner.generation_memory(
                len(jobs),
                max(len(j.prompt) for j in jobs),
                max(len(j.prompt) for j in jobs) + max(j.params.max_tokens for j in jobs),
            ),
            limit=limit,
            wait=wait,
        )
        if not jobs:
            return None
        try:
            batch = GenerationBatch(self.runner, [(j.prompt, j.params) for j in jobs])
        except Exception as exc:  # a failed batch fails its requests, not the server
            for job in jobs:
                job.loop.call_soon_threadsafe(_deliver, job.future, None, exc)
            return None
        self.stats.generation_batches += 1
        self.stats.generation_rows += len(jobs)
        self.stats.max_generation_batch = max(self.stats.max_generation_batch, len(jobs))
        return _RunningBatch(batch, jobs, time.perf_counter())

    def _step_generation(self, running: _RunningBatch) -> bool:
        """One step of a running batch; False when it is finished (or failed)."""
        try:
            finished = running.batch.step()
        except Exception as exc:  # a failed step fails its requests, not the server
            for job in running.jobs:
                job.loop.call_soon_threadsafe(_deliver, job.future, None, exc)
            return False
        self.stats.generation_steps += 1
        for index, result in finished.items():
            self.stats.generated_tokens += result.num_generated
            job = running.jobs[index]
            job.loop.call_soon_threadsafe(_deliver, job.future, result, None)
        if running.batch.done:
            self._generation_gather.last_size = len(running.jobs)
            # the window scales with one step, not the whole batch: a step is what a late request waits behind
            elapsed = time.perf_counter() - running.started
            self._generation_gather.last_seconds = elapsed / max(1, running.batch.steps)
            return False
        return True

    def _fail_waiting(self, error: BaseException, *, running: list[GenerateJob]) -> None:
        with self._cond:
            waiting: list[Any] = [*running, *self._scores, *self._generations]
            self._scores.clear()
            self._generations.clear()
        for job in waiting:
            if not job.loop.is_closed():
                job.loop.call_soon_threadsafe(_deliver, job.future, None, error)
