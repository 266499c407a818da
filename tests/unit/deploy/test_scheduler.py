"""The model thread's batching rules, driven directly with the tiny model in this process."""

from __future__ import annotations

import asyncio
from typing import Any

from ckpteval.deploy.engine import SamplingParams
from ckpteval.deploy.scheduler import GenerateJob, Scheduler, ScoreJob


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
