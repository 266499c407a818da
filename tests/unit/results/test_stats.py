"""The statistics of `evaluate compare` against values computed here by hand (not by calling ckpteval)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from ckpteval.results import stats
from ckpteval.results.compare import InvocationSamples, compare
from ckpteval.results.model import InvocationResults, Metric, TaskOutcome
from tests.support.comparisons import sample_rows

# 40 documents: both right on 15, both wrong on 15, only the baseline right on 2, only the candidate on 8
BASE = [1] * 15 + [0] * 15 + [1] * 2 + [0] * 8
CAND = [1] * 15 + [0] * 15 + [0] * 2 + [1] * 8
Z_975, Z_80 = 1.959963984540054, 0.8416212335729143  # standard normal quantiles


def _invocation(name: str, scores: list[float], task: str = "mmlu") -> InvocationSamples:
    rows = sample_rows(task, {"exact_match": scores})
    mean = sum(scores) / len(scores)
    outcome = TaskOutcome(
        name=task, status="succeeded", metrics={"exact_match": Metric(mean, None, len(scores))}, n_samples=len(scores)
    )
    results = InvocationResults(invocation=name, created="", status="succeeded", tasks={task: outcome})
    return InvocationSamples(results=results, samples={task: rows})


def test_exact_mcnemar_by_hand():
    # 10 discordant pairs, 2 of one kind: p = 2 * P(Binomial(10, 1/2) <= 2) = 2 * (1 + 10 + 45) / 1024
    assert stats.mcnemar_exact(2, 8) == pytest.approx(112 / 1024)
    assert stats.mcnemar_exact(8, 2) == pytest.approx(112 / 1024)
    assert stats.mcnemar_exact(5, 5) == 1.0  # capped
    assert stats.mcnemar_exact(0, 0) == 1.0
    assert stats.mcnemar_exact(0, 6) == pytest.approx(2 / 64)


def test_holm_by_hand():
    # sorted: .01*3 = .03, .03*2 = .06, .04*1 = .04 -> kept non-decreasing: .06
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_permutation_p_matches_the_exact_enumeration():
    diffs = [0.5, 0.25, 0.75, -0.1, 0.6, 0.3]
    observed = abs(sum(diffs) / len(diffs))
    flips = list(itertools.product([1, -1], repeat=len(diffs)))
    exact = sum(
        abs(sum(s * d for s, d in zip(signs, diffs, strict=True)) / len(diffs)) >= observed - 1e-12 for signs in flips
    ) / len(flips)
    assert exact == pytest.approx(4 / 64)
    assert stats.permutation_p(diffs, seed=0) == pytest.approx(exact, abs=0.01)


def test_a_pair_of_per_sample_files_compared_by_hand():
    result = compare(_invocation("a", BASE), [_invocation("b", CAND)])
    [row] = result.rows
    n = 40
    diffs = [c - b for b, c in zip(BASE, CAND, strict=True)]
    assert (diffs.count(-1), diffs.count(0), diffs.count(1)) == (2, 30, 8)
    # the difference and the test
    assert row.difference == pytest.approx(6 / 40)
    assert (row.n, row.test) == (n, "exact McNemar")
    assert row.p_value == pytest.approx(112 / 1024)
    assert row.p_adjusted == pytest.approx(112 / 1024)  # one comparison: Holm changes nothing
    assert row.verdict == "no evidence"
    # the bootstrap CI, redone here one resample at a time from the documented generator: how often each
    # distinct difference (-1, 0, +1: 2, 30, 8 documents) is drawn among n draws with replacement
    rng = np.random.default_rng(0)
    values, freq = np.array([-1.0, 0.0, 1.0]), np.array([2, 30, 8]) / n
    means = [float(rng.multinomial(n, freq) @ values) / n for _ in range(10_000)]
    low, high = np.quantile(means, [0.025, 0.975])
    assert (row.ci_low, row.ci_high) == (pytest.approx(low), pytest.approx(high))
    # ... and close to the normal approximation 0.15 +- 1.96 * sd / sqrt(n)
    sd = math.sqrt((10 - n * 0.15**2) / (n - 1))  # sum of d^2 is 10 (8 ones, 2 minus ones)
    assert sd == pytest.approx(0.48305, abs=1e-5)
    assert low == pytest.approx(0.15 - Z_975 * sd / math.sqrt(n), abs=0.03)
    assert high == pytest.approx(0.15 + Z_975 * sd / math.sqrt(n), abs=0.03)
    # the MDE at alpha 0.05, power 0.8
    assert row.mde == pytest.approx((Z_975 + Z_80) * sd / math.sqrt(n)) == pytest.approx(0.21398, abs=1e-4)


def test_a_clear_difference_is_a_verdict_and_identical_runs_are_no_evidence():
    base = [1] * 60 + [0] * 40
    worse = [0] * 30 + [1] * 30 + [0] * 40  # lost 30 of 60, gained none: p = 2 / 2**30
    result = compare(_invocation("a", base), [_invocation("b", worse), _invocation("c", base)])
    b, c = result.rows
    assert b.p_value == pytest.approx(2 / 2**30)
    assert b.verdict == "worse" and b.difference == pytest.approx(-0.3)
    assert b.ci_high < 0
    assert c.verdict == "no evidence" and c.p_value == 1.0 and c.difference == 0.0
    # identical scores: the MDE plans with the scores' spread, sqrt(2) * sd(base)
    sd = math.sqrt(0.6 * 0.4 * 100 / 99)
    assert c.mde == pytest.approx((Z_975 + Z_80) * math.sqrt(2) * sd / 10)
    assert result.regressions(0.0) == [b]
    assert result.regressions(0.35) == []


def test_only_common_documents_are_paired_and_holm_spans_tasks():
    a_rows = sample_rows("t1", {"acc": [1, 0, 1, 1, 0, 1]})
    b_rows = sample_rows("t1", {"acc": [1, 0, 1, 1]}, first_doc=2)  # documents 2..5: 4 in common
    a = _invocation("a", [1.0] * 10, task="t2")
    b = _invocation("b", [0.0] * 10, task="t2")
    a.samples["t1"] = a_rows
    b.samples["t1"] = b_rows
    a.results.tasks["t1"] = TaskOutcome(name="t1", status="succeeded", metrics={"acc": Metric(4 / 6, None, 6)})
    b.results.tasks["t1"] = TaskOutcome(name="t1", status="succeeded", metrics={"acc": Metric(3 / 4, None, 4)})
    result = compare(a, [b])
    t2, t1 = result.rows
    assert (t1.n, t1.n_baseline, t1.n_candidate) == (4, 6, 4)
    assert "4 common documents (of 6 and 4)" in t1.note
    # common documents 2..5: baseline 1, 1, 0, 1; candidate 1, 0, 1, 1 -> one discordant pair each way
    assert t1.baseline_value == pytest.approx(0.75) and t1.difference == 0.0
    assert t1.p_value == 1.0
    assert t2.p_value == pytest.approx(2 / 2**10)
    assert t2.p_adjusted == pytest.approx(2 * 2 / 2**10)  # Holm over 2 comparisons
    assert result.correction == "holm" and "Holm" in result.method()


def test_bootstrap_of_many_distinct_differences_draws_documents():
    diffs = np.linspace(-1.0, 2.0, 300)  # 300 distinct values: resamples draw document indices
    rng = np.random.default_rng(7)
    means = [diffs[rng.integers(0, 300, size=300)].mean() for _ in range(2_000)]
    expected = np.quantile(means, [0.05, 0.95])
    low, high = stats.bootstrap_ci(diffs, level=0.9, resamples=2_000, seed=7)
    assert (low, high) == (pytest.approx(expected[0]), pytest.approx(expected[1]))


def test_continuous_scores_use_the_permutation_test():
    a = _invocation("a", [0.2, 0.4, 0.5, 0.9, 0.1, 0.3, 0.7, 0.6])
    b = _invocation("b", [0.3, 0.5, 0.55, 0.95, 0.2, 0.35, 0.8, 0.7])  # higher on every document
    [row] = compare(a, [b]).rows
    assert row.test == "paired permutation"
    # every sign flip but the observed one (and its mirror) has a smaller |mean|: exact p = 2 / 256
    assert row.p_value == pytest.approx(2 / 256, abs=0.004)
    assert row.verdict == "better"


def test_a_task_that_failed_on_one_side_is_listed_not_tested():
    a = _invocation("a", [1.0, 0.0, 1.0])
    b = _invocation("b", [1.0, 1.0, 1.0])
    b.results.tasks["mmlu"] = TaskOutcome(name="mmlu", status="failed", error="the harness exited 1")
    [row] = compare(a, [b]).rows
    assert row.p_value is None and row.verdict == "no evidence"
    assert row.note == "not compared: succeeded / failed"
    [back] = compare(b, [a]).rows  # the failed side as the baseline
    assert back.note == "not compared: failed / succeeded"
