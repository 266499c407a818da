"""Scores of repeated sampling: pass@1[avg-of-k], majority@k and pass@k from k runs over the same problems.

Each of the k runs answers every problem once (at a sampling temperature, with its own seed). Per
problem we have k extracted answers and k scores (the task's per-sample metric, e.g. lm-eval's
`exact_match` of one filter). The evaluation modes, named as NeMo-Skills names them:

- `pass@1[avg-of-k]`: the mean score over all k samples of every problem (the expected score of one
  sample), with the spread of the k per-run averages: `std_dev` (sample standard deviation across the
  runs) and `stderr` (std_dev / sqrt(k));
- `majority@k`: the score of the most common extracted answer per problem. Samples without an answer
  (lm-eval's filters give "[invalid]") do not vote; ties go to the smallest answer (sorted), so the
  result is reproducible; a problem with no answer at all scores 0;
- `pass@k`: the probability that at least one of k samples is right, with the unbiased estimator
  1 - C(n-c, k) / C(n, k) of n samples of which c are right (Chen et al., 2021) for 0/1 scores; for
  other scores the best of the k.

majority@k, pass@k (and pass@1 of a single run) get the standard error of a mean over problems: the
sample standard deviation of the per-problem scores / sqrt(n).

With k = 1 the three coincide with one sample's score and only `pass@1` is reported. Values stay on
the task's own scale (fractions for lm-eval), never turned into percentages.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

# What lm-eval's regex filters return when they find no answer (their `fallback`), and an empty answer.
NO_ANSWER = frozenset({"", "[invalid]"})


@dataclass(frozen=True)
class Sample:
    """One sampled answer to one problem: the extracted answer (None: none found) and its score."""

    answer: str | None
    score: float


@dataclass(frozen=True)
class ModeScore:
    """One evaluation mode's score over all problems."""

    value: float
    n_problems: int
    stderr: float | None = None  # pass@1[avg-of-k]: standard error across the k runs
    std_dev: float | None = None  # pass@1[avg-of-k]: standard deviation across the k runs


def mode_names(k: int) -> tuple[str, ...]:
    """The evaluation modes reported for k samples per problem, in display order."""
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if k == 1:
        return ("pass@1",)
    return (f"pass@1[avg-of-{k}]", f"majority@{k}", f"pass@{k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:  # every choice of k samples holds a correct one
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_vote(samples: Sequence[Sample]) -> Sample | None:
    """The most common answer (ties: the smallest) with the mean score of the samples giving it;
    None when no sample has an answer."""
    voted = [s for s in samples if s.answer is not None]
    if not voted:
        return None
    counts = Counter(s.answer for s in voted if s.answer is not None)
    top = max(counts.values())
    answer = min(a for a, n in counts.items() if n == top)
    scores = [s.score for s in voted if s.answer == answer]
    return Sample(answer, sum(scores) / len(scores))


def _is_binary(values: Sequence[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def repeated_scores(runs: Sequence[Mapping[Hashable, Sample]]) -> dict[str, ModeScore]:
    """Every evaluation mode's score of k runs (one mapping problem -> sample per run).

    Every run must answer the same problems; otherwise the modes would mix different problem sets.
    """
    k = len(runs)
    if k == 0:
        raise ValueError("no runs")
    problems = list(runs[0])
    for i, run in enumerate(runs[1:], start=1):
        if set(run) != set(problems):
            missing = len(set(problems) - set(run)) + len(set(run) - set(problems))
            raise ValueError(f"run {i} does not answer the same problems as run 0 ({missing} differ)")
    if not problems:
        raise ValueError("no problems")
    per_problem = [[run[p] for run in runs] for p in problems]
    n = len(problems)

    run_means = [sum(run[p].score for p in problems) / n for run in runs]
    mean = sum(run_means) / k
    if k == 1:
        return {
            "pass@1": ModeScore(mean, n, stderr=_stderr_over_problems([run[p].score for run in runs for p in problems]))
        }
    std_dev = statistics.stdev(run_means)
    majority = [majority_vote(samples) for samples in per_problem]
    majority_mean = sum(m.score if m is not None else 0.0 for m in majority) / n
    best = []
    for samples in per_problem:
        scores = [s.score for s in samples]
        best.append(pass_at_k(k, int(sum(scores)), k) if _is_binary(scores) else max(scores))
    names = mode_names(k)
    majority_scores = [m.score if m is not None else 0.0 for m in majority]
    return {
        names[0]: ModeScore(mean, n, stderr=std_dev / math.sqrt(k), std_dev=std_dev),
        names[1]: ModeScore(majority_mean, n, stderr=_stderr_over_problems(majority_scores)),
        names[2]: ModeScore(sum(best) / n, n, stderr=_stderr_over_problems(best)),
    }


def _stderr_over_problems(values: Sequence[float]) -> float | None:
    """The standard error of a mean over problems: sample standard deviation / sqrt(n) (None for n < 2)."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
