"""The model thread's batching rules, driven directly with the tiny model in this process."""

from __future__ import annotations

import asyncio
from typing import Any

from ckpteval.server.engine import SamplingParams
from ckpteval.server.scheduler import GenerateJob, Scheduler, ScoreJob


def run_jobs(scheduler: Scheduler, make_jobs: Any) -> list[Any]:
    """Queue every job before the thread starts (so it sees them all at once), then wait for the results."""

    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        jobs = make_jobs(loop)
        for job in jobs:
            scheduler.submit(job)
        scheduler.start()
        return list(await asyncio.gather(*(job.future for job in jobs)))

    try:
        return asyncio.run(main())
    finally:
        scheduler.stop()


def test_scoring_batches_stop_at_the_memory_budget(tiny_loaded: Any) -> None:
    runner = tiny_loaded.runner
    rows = [[65 + i % 26] * 200 for i in range(10)]
    scheduler = Scheduler(runner, max_batch_memory=3 * runner.score_memory(1, 200))
    results = run_jobs(
        scheduler, lambda loop: [ScoreJob(tokens=r, top_k=1, future=loop.create_future(), loop=loop) for r in rows]
    )
    assert scheduler.stats.max_score_batch == 3
    assert scheduler.stats.score_rows == 10 and scheduler.stats.score_forwards == 4
    for row, result in zip(rows, results, strict=True):
        alone = runner.score([row])[0].token_logprobs
        assert max(abs(a - b) for a, b in zip(result.token_logprobs, alone, strict=True)) < 1e-5


def test_a_request_over_the_budget_still_runs_alone(tiny_loaded: Any) -> None:
    scheduler = Scheduler(tiny_loaded.runner, max_batch_memory=1)
    results = run_jobs(
        scheduler, lambda loop: [ScoreJob(tokens=[66] * 50, top_k=2, future=loop.create_future(), loop=loop)]
    )
    assert len(results[0].top_ids[0]) == 2
    assert scheduler.stats.max_score_batch == 1


def test_generation_rows_are_batched_up_to_the_batch_size(tiny_loaded: Any) -> None:
    params = SamplingParams(max_tokens=5)
    scheduler = Scheduler(tiny_loaded.runner, max_batch_size=4)
    results = run_jobs(
        scheduler,
        lambda loop: [
            GenerateJob(prompt=[70 + i] * (3 + i), params=params, future=loop.create_future(), loop=loop)
            for i in range(6)
        ],
    )
    assert [len(r.token_ids) <= 5 for r in results] == [True] * 6
    assert scheduler.stats.max_generation_batch == 4 and scheduler.stats.generation_rows == 6
    for i, result in enumerate(results):
        alone = tiny_loaded.runner.generate([([70 + i] * (3 + i), params)])[0]
        assert result.token_ids == alone.token_ids


def test_batches_hold_one_length_bucket_within_the_token_budget(tiny_loaded: Any) -> None:
    rows = [[66] * (200 if i % 2 else 20) for i in range(12)]  # long and short, interleaved
    scheduler = Scheduler(tiny_loaded.runner, max_batch_tokens=4 * 200)
    results = run_jobs(
        scheduler, lambda loop: [ScoreJob(tokens=r, top_k=1, future=loop.create_future(), loop=loop) for r in rows]
    )
    stats = scheduler.stats
    assert [len(r.token_logprobs) for r in results] == [len(r) - 1 for r in rows]
    # the 6 short rows in one forward; the 6 long ones in two (4 x 200 tokens at most)
    assert stats.score_forwards == 3 and stats.max_score_batch == 6
    assert stats.score_padded_tokens == stats.score_tokens  # nothing padded: no short row beside a long one


def test_clients_that_come_back_fill_whole_batches(tiny_loaded: Any) -> None:
    """8 clients, each sending its next request when the last one is answered, batch size 8.

    The first client starts alone; the others arrive while its forward runs. The batches must
    settle at 8 rows, not keep alternating between the clients answered and those still waiting.
    """
    runner = tiny_loaded.runner
    scheduler = Scheduler(runner, max_batch_size=8)
    requests_each = 8

    async def client(loop: asyncio.AbstractEventLoop, delay: float) -> None:
        await asyncio.sleep(delay)
        for i in range(requests_each):
            future = loop.create_future()
            scheduler.submit(ScoreJob(tokens=[70 + i] * 120, top_k=1, future=future, loop=loop))
            await future

    async def main() -> None:
        loop = asyncio.get_running_loop()
        scheduler.start()
        await asyncio.gather(client(loop, 0.0), *(client(loop, 0.001) for _ in range(7)))

    try:
        asyncio.run(main())
    finally:
        scheduler.stop()
    stats = scheduler.stats
    assert stats.score_rows == 8 * requests_each
    assert stats.max_score_batch == 8
    assert stats.score_forwards <= requests_each + 3, stats  # ~one forward per round of all 8 clients
