"""`compare` tests every kind of task we ship on its per-sample scores: each one's harness output (in lm-eval's
real format; HumanEval's recorded from a real run) is collected as a finished job collects it, then two
invocations are compared and every metric gets its paired test and p-value."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpteval.results.collect import collect_results
from ckpteval.results.compare import MCNEMAR, PERMUTATION, Comparison, InvocationSamples, compare
from tests.support.lm_eval_runs import finish, gsm8k_run, hellaswag_run, humaneval_run, repeated_gsm8k_run

N = 30
BASE = [i < 20 for i in range(N)]  # 20 of 30 right
WORSE = [i < 12 for i in range(N)]  # 8 of those lost, none gained


def mcnemar(only_baseline: int, only_candidate: int) -> float:
    """Exact two-sided McNemar p: a binomial(n, 1/2) test on the discordant pairs."""
    n, k = only_baseline + only_candidate, min(only_baseline, only_candidate)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def _invocation(root: Path, name: str, task: str, write: Callable[[Path], None]) -> InvocationSamples:
    job_dir = root / name
    task_dir = job_dir / "tasks" / task
    write(task_dir)
    finish(task_dir)
    results = collect_results(
        job_dir, [(task, f"tasks/{task}")], invocation=name, created="2026-11-27T10:00:00Z", model=None
    )
    assert results.tasks[task].status == "succeeded", results.tasks[task].error
    assert (task_dir / "samples.jsonl").is_file()
    return InvocationSamples.load(job_dir, results, {task: f"tasks/{task}"})


def _compared(
    tmp_path: Path, task: str, baseline: Callable[[Path], None], candidate: Callable[[Path], None]
) -> Comparison:
    a = _invocation(tmp_path, "aaaa0001", task, baseline)
    b = _invocation(tmp_path, "bbbb0002", task, candidate)
    return compare(a, [b])


def test_log_likelihood_multiple_choice(tmp_path: Path) -> None:
    result = _compared(tmp_path, "hellaswag", lambda d: hellaswag_run(d, BASE), lambda d: hellaswag_run(d, WORSE))
    rows = {r.metric: r for r in result.rows}
    assert set(rows) == {"acc", "acc_norm"}
    for row in rows.values():
        assert row.test == MCNEMAR and row.n == N
        assert row.p_value == pytest.approx(mcnemar(8, 0))
        assert row.difference == pytest.approx(-8 / N)
        assert row.verdict == "worse"


def test_generation_with_two_filters(tmp_path: Path) -> None:
    result = _compared(
        tmp_path, "gsm8k", lambda d: gsm8k_run(d / "output", BASE), lambda d: gsm8k_run(d / "output", WORSE)
    )
    rows = {r.metric: r for r in result.rows}
    strict, flexible = rows["exact_match__strict-match"], rows["exact_match__flexible-extract"]
    assert strict.test == MCNEMAR and strict.p_value == pytest.approx(mcnemar(8, 0)) and strict.verdict == "worse"
    # every flexible-extract answer is right in both: tested, no evidence of a difference
    assert flexible.test == MCNEMAR and flexible.p_value == 1.0 and flexible.difference == 0.0


def test_code_humaneval_from_a_recorded_run(tmp_path: Path) -> None:
    # recorded: problems 0 and 2 pass; the candidate fails 0 and passes 1 and 3
    result = _compared(
        tmp_path,
        "adlr_humaneval_greedy",
        humaneval_run,
        lambda d: humaneval_run(d, {0: False, 1: True, 3: True}),
    )
    [row] = result.rows
    assert row.metric == "pass_at_1__n=1__evalplus_sanitize"
    assert row.note == ""  # not "not tested: no per-sample scores"
    assert row.test == MCNEMAR and row.n == 4
    assert (row.baseline_value, row.candidate_value) == (0.5, 0.75)
    assert row.p_value == pytest.approx(mcnemar(1, 2))


def test_repeated_sampling(tmp_path: Path) -> None:
    # per document: the mean over 2 repeats; the candidate loses one repeat's answer on 10 documents
    result = _compared(
        tmp_path,
        "gsm8k",
        lambda d: repeated_gsm8k_run(d, [BASE, BASE]),
        lambda d: repeated_gsm8k_run(d, [BASE, [i < 10 for i in range(N)]]),
    )
    strict = next(r for r in result.rows if r.metric == "exact_match__strict-match")
    assert strict.test == PERMUTATION and strict.n == N
    assert strict.difference == pytest.approx(-0.5 * 10 / N)
    # ten equal drops: the exact sign-flip p is 2 / 2**10 (estimated from 10,000 resamples)
    assert strict.p_value is not None and 0 < strict.p_value < 0.01
    assert strict.verdict == "worse"


def test_a_metric_only_computed_over_the_whole_set_says_so() -> None:
    """A corpus-level metric (BLEU over the set) has no per-document score: its row says why it is untested,
    while the task's per-document metric is tested."""
    from ckpteval.results.model import InvocationResults, Metric, TaskOutcome
    from tests.support.comparisons import sample_rows

    def invocation(name: str, right: list[bool]) -> InvocationSamples:
        rows = sample_rows("translate", {"exact_match": [float(x) for x in right]})
        metrics = {"exact_match": Metric(sum(right) / N, None, N), "bleu": Metric(0.31, None, N)}
        outcome = TaskOutcome(name="translate", status="succeeded", metrics=metrics, n_samples=N)
        results = InvocationResults(invocation=name, created="", status="succeeded", tasks={"translate": outcome})
        return InvocationSamples(results=results, samples={"translate": rows})

    rows = {r.metric: r for r in compare(invocation("aaaa0001", BASE), [invocation("bbbb0002", WORSE)]).rows}
    assert rows["exact_match"].p_value == pytest.approx(mcnemar(8, 0))
    assert rows["bleu"].p_value is None
    assert rows["bleu"].note == "not tested: bleu is computed over the whole set (no per-document score to pair)"
