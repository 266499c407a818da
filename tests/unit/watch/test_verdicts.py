"""Is checkpoint N better? The paired test of `evaluate compare` against the previous checkpoint and the
best so far, per task metric, computed from per-sample scores (in memory here; read from the job dirs in
production) and shown as the watcher's events, `watch status` lines and W&B step-indexed metrics."""

from __future__ import annotations

import pytest

from ckpteval.results.compare import InvocationSamples
from ckpteval.results.model import InvocationResults, Metric, TaskOutcome
from ckpteval.results.samples import SampleScore
from ckpteval.watch.state import Attempt, IterationEntry, WatchSpec, WatchState
from ckpteval.watch.verdicts import NO_DIFFERENCE, judge, verdict_lines, verdict_metrics


def _samples(invocation: str, correct: set[int], n: int = 100) -> InvocationSamples:
    acc = len(correct) / n
    results = InvocationResults(
        invocation=invocation,
        created="now",
        status="succeeded",
        tasks={"hellaswag": TaskOutcome("hellaswag", "succeeded", metrics={"acc": Metric(acc, 0.04, n)})},
    )
    rows = [SampleScore("hellaswag", i, f"doc{i}", {"acc": 1.0 if i in correct else 0.0}) for i in range(n)]
    return InvocationSamples(results=results, samples={"hellaswag": rows})


def test_verdicts_against_the_previous_checkpoint_and_the_best_so_far():
    # 10 answers 80 documents right, 20 only 30 of them, 30 the same 80 as 10 again
    runs = {"inv10": set(range(80)), "inv20": set(range(30)), "inv30": set(range(80))}
    state = WatchState(run="r", spec=WatchSpec("/s", ["tiny"], None, [], []), created=0.0)
    for it in (10, 20, 30):
        entry = IterationEntry(it, f"/s/iter_{it:07d}", "succeeded", 0.0, attempts=[Attempt(f"inv{it}", 0.0)])
        entry.metrics = {"hellaswag/acc": len(runs[f"inv{it}"]) / 100, "hellaswag/acc_stderr": 0.04}
        state.iterations[it] = entry
    loaded: list[str] = []

    def load(invocation: str) -> InvocationSamples:
        loaded.append(invocation)
        return _samples(invocation, runs[invocation])

    judge(state, state.iterations[10], load=load)
    assert state.iterations[10].verdicts == {}  # the first checkpoint: nothing to compare with

    judge(state, state.iterations[20], load=load)
    [prev] = state.iterations[20].verdicts["previous"]
    assert prev["against"] == 10 and prev["verdict"] == "worse"
    assert prev["delta"] == pytest.approx(-0.5) and prev["ci_low"] <= -0.5 <= prev["ci_high"] < 0

    judge(state, state.iterations[30], load=load)
    [prev] = state.iterations[30].verdicts["previous"]
    [best] = state.iterations[30].verdicts["best"]
    assert (prev["against"], prev["verdict"]) == (20, "better")
    # the best so far is 10 (0.8): the same answers, so no detectable difference, and how small a
    # difference could have been seen at this n
    assert (best["against"], best["verdict"], best["delta"]) == (10, NO_DIFFERENCE, 0.0)
    assert best["mde"] is not None and 0 < best["mde"] < 0.5 and best["n"] == 100
    lines = verdict_lines(state.iterations[30])
    assert lines[0].startswith("vs previous: hellaswag acc +0.5 [") and lines[0].endswith("vs iteration 20: better")
    assert "vs iteration 10: no detectable difference (detectable: ±" in lines[1]
    metrics = verdict_metrics(state.iterations[30])
    assert metrics["hellaswag/acc/vs_previous/verdict"] == 1.0
    assert metrics["hellaswag/acc/vs_best/verdict"] == 0.0
    assert metrics["hellaswag/acc/vs_previous/delta"] == pytest.approx(0.5)


def test_without_per_sample_scores_the_row_says_it_was_not_tested():
    state = WatchState(run="r", spec=WatchSpec("/s", ["tiny"], None, [], []), created=0.0)
    for it in (10, 20):
        entry = IterationEntry(it, "/s", "succeeded", 0.0, attempts=[Attempt(f"inv{it}", 0.0)])
        entry.metrics = {"hellaswag/acc": 0.5}
        state.iterations[it] = entry

    def load(invocation: str) -> InvocationSamples:
        return InvocationSamples(results=_samples(invocation, set()).results)  # aggregate only

    judge(state, state.iterations[20], load=load)
    [row] = state.iterations[20].verdicts["previous"]
    assert not row["tested"] and "no per-sample scores" in row["note"]
    assert verdict_metrics(state.iterations[20]) == {}
    assert "not tested against iteration 10" in verdict_lines(state.iterations[20])[0]
