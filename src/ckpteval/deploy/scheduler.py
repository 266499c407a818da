"""The model thread: batches concurrent requests and hands results back to the event loop.

HTTP handlers (on the asyncio loop) submit jobs; one thread owns the model and runs, in turn, a
scoring forward over the waiting score jobs and one step of the running generation batch, so
loglikelihood requests are never stuck behind a long generation. A new generation batch starts
when the previous one is done.

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


@dataclass
class _Gather:
    last_size: int = 1
    last_seconds: float = 0.0


@dataclass
class Scheduler:
    """Owns the model thread. `submit()` from the event loop; results arrive on the jobs' futures."""

    runner: ModelRunner
    max_batch_size: int = 16
    max_batch_tokens: int = 8192  # bounds the [rows, length, vocab] logits of one scoring forward
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
        batch: GenerationBatch | None = None
        jobs: list[GenerateJob] = []
        while True:
            with self._cond:
                while not (self._stopping or self._scores or self._generations or batch is not None):
                    self._cond.wait()
                if self._stopping:
                    break
            if self._scores:
                self._run_scores()
            if batch is None and self._generations:
                jobs = self._take(
                    self._generations, self._generation_gather, tokens=lambda j: len(j.prompt) + j.params.max_tokens
                )
                batch = self._start_generation(jobs)
            if batch is not None:
                batch = self._step_generation(batch, jobs)
        self._fail_waiting(RuntimeError("the server is shutting down"), running=jobs if batch is not None else [])

    def _take(self, queue: deque[Any], gather: _Gather, *, tokens: Any) -> list[Any]:
        want = min(self.max_batch_size, gather.last_size)
        deadline = time.monotonic() + min(self.max_gather_seconds, self.gather_fraction * gather.last_seconds)
        with self._cond:
            while len(queue) < want and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            taken: list[Any] = []
            longest = 0
            while queue and len(taken) < self.max_batch_size:
                longest_if = max(longest, tokens(queue[0]))
                if taken and longest_if * (len(taken) + 1) > self.max_batch_tokens:
                    break
                taken.append(queue.popleft())
                longest = longest_if
        return taken

    def _run_scores(self) -> None:
        jobs: list[ScoreJob] = self._take(self._scores, self._score_gather, tokens=lambda j: len(j.tokens))
        if not jobs:
            return
        started = time.perf_counter()
        try:
            rows = self.runner.score([j.tokens for j in jobs], top_k=max(j.top_k for j in jobs))
        except Exception as exc:
            for job in jobs:
                job.loop.call_soon_threadsafe(_deliver, job.future, None, exc)
            return
        self._score_gather.last_size = len(jobs)
        self._score_gather.last_seconds = time.perf_counter() - started
        self.stats.score_forwards += 1
        self.stats.score_rows += len(jobs)
        self.stats.max_score_batch = max(self.stats.max_score_batch, len(jobs))
        for job, row in zip(jobs, rows, strict=True):
            if job.top_k < len(row.top_ids[0]):  # trim to what this request asked for
                row = ScoredRow(
                    row.token_logprobs,
                    [t[: job.top_k] for t in row.top_ids],
                    [t[: job.top_k] for t in row.top_logprobs],
                )
            job.loop.call_soon_threadsafe(_deliver, job.future, row, None)

    def _start_generation(self, jobs: list[GenerateJob]) -> GenerationBatch | None:
        if not jobs:
            return None
        self._generation_started = time.perf_counter()
        try:
            batch = GenerationBatch(self.runner, [(j.prompt, j.params) for j in jobs])
        except Exception as exc:
            for job in jobs:
                job.loop.call_soon_threadsafe(_deliver, job.future, None, exc)
            return None
        self.stats.generation_batches += 1
        self.stats.generation_rows += len(jobs)
        self.stats.max_generation_batch = max(self.stats.max_generation_batch, len(jobs))
        return batch

    def _step_generation(self, batch: GenerationBatch, jobs: list[GenerateJob]) -> GenerationBatch | None:
        try:
            finished = batch.step()
        except Exception as exc:
            for job in jobs:
                job.loop.call_soon_threadsafe(_deliver, job.future, None, exc)
            return None
        self.stats.generation_steps += 1
        for index, result in finished.items():
            self.stats.generated_tokens += result.num_generated
            job = jobs[index]
            job.loop.call_soon_threadsafe(_deliver, job.future, result, None)
        if batch.done:
            self._generation_gather.last_size = len(jobs)
            # the gather window scales with one step, not the whole batch: steps are what a late
            # request would wait behind
            self._generation_gather.last_seconds = (time.perf_counter() - self._generation_started) / max(
                1, batch.steps
            )
            return None
        return batch

    def _fail_waiting(self, error: BaseException, *, running: list[GenerateJob]) -> None:
        with self._cond:
            waiting: list[Any] = [*running, *self._scores, *self._generations]
            self._scores.clear()
            self._generations.clear()
        for job in waiting:
            if not job.loop.is_closed():
                job.loop.call_soon_threadsafe(_deliver, job.future, None, error)
