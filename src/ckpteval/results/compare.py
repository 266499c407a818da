"""Compare invocations task by task on the documents they both scored: is the candidate better, worse, or
is there no evidence either way?

For each candidate against the baseline, each task both ran and each metric with per-sample scores:
the mean difference (candidate - baseline) on the common documents, its bootstrap confidence interval,
a paired test (exact McNemar for 0/1 scores, a sign-flip permutation test otherwise), the p-value after
Holm's correction over every task and metric of that pair, the minimum detectable effect at that n,
and a verdict. The formulas are in `ckpteval.results.stats` and docs/compare.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ckpteval.errors import EvaluationError
from ckpteval.results import stats
from ckpteval.results.model import InvocationResults
from ckpteval.results.samples import SAMPLES_FILE, SampleScore, doc_scores, read_samples, task_sample_scores

BETTER, WORSE, NO_EVIDENCE = "better", "worse", "no evidence"
MCNEMAR, PERMUTATION = "exact McNemar", "paired permutation"
CORRECTION = "holm"
# `evaluate compare --fail-on-regression` exits with this code when a candidate is significantly worse
# (1 and 2 are ckpteval's errors: a failure, a bad configuration or command line)
REGRESSION_EXIT_CODE = 3
# ... and with this one when nothing is significantly worse but the comparison cannot be trusted to say so: a
# side's caveats (`ckpteval.results.caveats`) or a difference besides the model's (`--allow-caveats` lets it pass)
UNTRUSTED_EXIT_CODE = 4
NOT_ONLY_THE_MODEL = "the difference is not only the model's"
CAVEAT, WARNING = "caveat", "warning"  # how each line of `Comparison.warning_lines` starts


@dataclass(frozen=True)
class InvocationSamples:
    """An invocation's results and, per task, its per-sample scores (absent: the harness kept none)."""

    results: InvocationResults
    samples: dict[str, list[SampleScore]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.results.invocation

    @staticmethod
    def load(job_dir: Path, results: InvocationResults, task_dirs: Mapping[str, str]) -> InvocationSamples:
        """Per-sample scores of every succeeded task from `<job_dir>/<task dir>/samples.jsonl`; an older job
        without that file has them rebuilt from the harness output (nothing is written)."""
        samples: dict[str, list[SampleScore]] = {}
        for task, outcome in results.tasks.items():
            if outcome.status != "succeeded":
                continue
            task_dir = job_dir / task_dirs.get(task, f"tasks/{task}")
            path = task_dir / SAMPLES_FILE
            if path.is_file():
                samples[task] = read_samples(path)
                continue
            try:
                samples[task] = task_sample_scores(task_dir, outcome.harness or task, outcome.repeats)
            except EvaluationError:
                continue  # no per-sample output: the task is compared on its aggregate only
        return InvocationSamples(results=results, samples={k: v for k, v in samples.items() if v})


@dataclass(frozen=True)
class MetricComparison:
    """One task metric of a candidate against the baseline."""

    task: str
    metric: str
    baseline: str
    candidate: str
    baseline_value: float | None  # mean on the common documents (the reported value when not paired)
    candidate_value: float | None
    difference: float | None  # candidate - baseline
    n: int  # documents compared (both scored them)
    n_baseline: int
    n_candidate: int
    ci_low: float | None = None
    ci_high: float | None = None
    test: str | None = None  # MCNEMAR | PERMUTATION | None: not tested
    p_value: float | None = None
    p_adjusted: float | None = None  # after Holm's correction
    mde: float | None = None
    verdict: str = NO_EVIDENCE
    note: str = ""

    @property
    def drop(self) -> float:
        """How much the candidate lost (positive: worse)."""
        return -(self.difference or 0.0)


@dataclass(frozen=True)
class Comparison:
    """Every metric comparison of every candidate against one baseline, and how they were made."""

    baseline: str
    candidates: list[str]
    rows: list[MetricComparison]
    alpha: float = 0.05
    level: float = 0.95
    power: float = 0.8
    correction: str = CORRECTION
    seed: int = stats.DEFAULT_SEED
    resamples: int = stats.DEFAULT_RESAMPLES
    labels: dict[str, str] = field(default_factory=dict)  # invocation -> its run label, where it has one
    # what besides the model differs between the baseline and a candidate (tokenizer, task settings, harness
    # versions: `provenance_differences`), one sentence each: their difference is then not only the model's
    warnings: list[str] = field(default_factory=list)
    # invocation -> its caveats, one line each (`ckpteval.results.caveats`): its numbers are not a verified
    # score of its model (no provenance, an ignored origin mismatch, an unverified endpoint, ...)
    caveats: dict[str, list[str]] = field(default_factory=dict)

    def warning_lines(self) -> list[str]:
        """Every warning a reader of this comparison must see, word for word as `evaluate compare` prints
        them and `evaluate report` shows them: each invocation's caveats (`caveat: ...`), then each difference
        besides the model (`warning: ...`)."""
        return [
            *(f"{CAVEAT}: {name}: {line}" for name, lines in self.caveats.items() for line in lines),
            *(f"{WARNING}: {w}; {NOT_ONLY_THE_MODEL}" for w in self.warnings),
        ]

    def untrusted(self) -> list[str]:
        """Why the gate (`--fail-on-regression`) cannot trust this comparison: the same lines."""
        return self.warning_lines()

    def regressions(self, max_drop: float = 0.0) -> list[MetricComparison]:
        """Rows where the candidate is significantly worse (after correction) by more than `max_drop`."""
        return [r for r in self.rows if r.verdict == WORSE and r.drop > max_drop]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def _per_candidate(self) -> int:
        return max(
            (sum(1 for r in self.rows if r.candidate == c and r.p_value is not None) for c in self.candidates),
            default=0,
        )

    def method(self) -> str:
        """One line that says how the numbers were made (for tables and reports)."""
        return (
            f"difference = candidate - baseline on the documents both scored; {self.level:.0%} CI: paired "
            f"percentile bootstrap ({self.resamples} resamples, seed {self.seed}); p: exact McNemar for 0/1 "
            f"scores, paired sign-flip permutation otherwise; Holm-corrected over each candidate's "
            f"{self._per_candidate()} comparisons; verdict at alpha {self.alpha}; "
            f"MDE at alpha {self.alpha}, power {self.power:.0%}"
        )


def compare(
    baseline: InvocationSamples,
    candidates: Sequence[InvocationSamples],
    *,
    alpha: float = 0.05,
    level: float = 0.95,
    power: float = 0.8,
    seed: int = stats.DEFAULT_SEED,
    resamples: int = stats.DEFAULT_RESAMPLES,
) -> Comparison:
    """Compare each candidate with the baseline (Holm's correction within each candidate's comparisons), and
    say what besides the model differs between them (`Comparison.warnings`)."""
    from ckpteval.results.caveats import caveats
    from ckpteval.results.provenance import provenance_differences

    rows: list[MetricComparison] = []
    warnings: list[str] = []
    for candidate in candidates:
        both = [t for t in baseline.results.tasks if t in candidate.results.tasks]
        for difference in provenance_differences(baseline.results.provenance, candidate.results.provenance, both):
            warnings.append(f"{candidate.name} vs {baseline.name}: {difference}")
        pair = [
            _compare_metric(
                baseline, candidate, task, metric, level=level, power=power, alpha=alpha, seed=seed, resamples=resamples
            )
            for task, metric in _task_metrics(baseline, candidate)
        ]
        tested = [i for i, r in enumerate(pair) if r.p_value is not None]
        adjusted = stats.holm([pair[i].p_value for i in tested])  # type: ignore[misc]
        for i, p_adj in zip(tested, adjusted, strict=True):
            row = pair[i]
            verdict = NO_EVIDENCE
            if p_adj < alpha and row.difference:
                verdict = BETTER if row.difference > 0 else WORSE
            pair[i] = replace(row, p_adjusted=p_adj, verdict=verdict)
        rows.extend(pair)
    return Comparison(
        baseline=baseline.name,
        candidates=[c.name for c in candidates],
        rows=rows,
        alpha=alpha,
        level=level,
        power=power,
        seed=seed,
        resamples=resamples,
        labels={x.name: x.results.label for x in (baseline, *candidates) if x.results.label},
        warnings=warnings,
        caveats={x.name: lines for x in (baseline, *candidates) if (lines := [c.line() for c in caveats(x.results)])},
    )


def _task_metrics(a: InvocationSamples, b: InvocationSamples) -> list[tuple[str, str]]:
    """(task, metric) pairs both invocations report, in the baseline's order; a task that did not succeed
    in one of them keeps the other's metrics (its rows say why they were not compared)."""
    out = []
    for task, outcome in a.results.tasks.items():
        other = b.results.tasks.get(task)
        if other is None:
            continue
        both = outcome.status == other.status == "succeeded"
        for metric in outcome.metrics or other.metrics:
            if metric in other.metrics or not both:
                out.append((task, metric))
    return out


def _compare_metric(
    a: InvocationSamples,
    b: InvocationSamples,
    task: str,
    metric: str,
    *,
    level: float,
    power: float,
    alpha: float,
    seed: int,
    resamples: int,
) -> MetricComparison:
    ta, tb = a.results.tasks[task], b.results.tasks[task]
    ma, mb = ta.metrics.get(metric), tb.metrics.get(metric)
    base = MetricComparison(
        task=task,
        metric=metric,
        baseline=a.name,
        candidate=b.name,
        baseline_value=ma.value if ma else None,
        candidate_value=mb.value if mb else None,
        difference=(mb.value - ma.value) if ma and mb else None,
        n=0,
        n_baseline=(ma.n_samples or 0) if ma else 0,
        n_candidate=(mb.n_samples or 0) if mb else 0,
    )
    if ta.status != "succeeded" or tb.status != "succeeded":
        return replace(base, difference=None, note=f"not compared: {ta.status} / {tb.status}")
    sa = doc_scores(a.samples.get(task, []), metric)
    sb = doc_scores(b.samples.get(task, []), metric)
    if not sa or not sb:
        if a.samples.get(task) and b.samples.get(task):  # other metrics of the task have them: this one cannot
            return replace(
                base, note=f"not tested: {metric} is computed over the whole set (no per-document score to pair)"
            )
        missing = " and ".join(x.name for x, s in ((a, sa), (b, sb)) if not s)
        return replace(base, note=f"not tested: no per-sample scores in {missing}")
    common = sorted(set(sa) & set(sb))
    n_a, n_b = len(sa), len(sb)
    if not common:
        return replace(
            base, n_baseline=n_a, n_candidate=n_b, difference=None, note="not compared: no document in common"
        )
    xa = [sa[k] for k in common]
    xb = [sb[k] for k in common]
    diffs = [y - x for x, y in zip(xa, xb, strict=True)]
    n = len(common)
    note = "" if n == n_a == n_b else f"compared on the {n} common documents (of {n_a} and {n_b})"
    if stats.is_binary(xa + xb):
        only_a = sum(1 for x, y in zip(xa, xb, strict=True) if x == 1.0 and y == 0.0)
        only_b = sum(1 for x, y in zip(xa, xb, strict=True) if x == 0.0 and y == 1.0)
        test, p = MCNEMAR, stats.mcnemar_exact(only_a, only_b)
    else:
        test, p = PERMUTATION, stats.permutation_p(diffs, resamples=resamples, seed=seed)
    low, high = stats.bootstrap_ci(diffs, level=level, resamples=resamples, seed=seed)
    sd = stats.sample_sd(diffs)
    if sd == 0:  # identical scores on every document: plan with the scores' own spread
        sd = math.sqrt(stats.sample_sd(xa) ** 2 + stats.sample_sd(xb) ** 2)
    return replace(
        base,
        baseline_value=sum(xa) / n,
        candidate_value=sum(xb) / n,
        difference=sum(diffs) / n,
        n=n,
        n_baseline=n_a,
        n_candidate=n_b,
        ci_low=low,
        ci_high=high,
        test=test,
        p_value=p,
        mde=stats.minimum_detectable_effect(sd, n, alpha=alpha, power=power),
        note=note,
    )
