"""Is this checkpoint better? `evaluate compare`'s paired test along the curve.

After each evaluation that succeeds, the checkpoint is compared on the documents both scored with
(a) the previous evaluated checkpoint and (b) per task metric, the best earlier checkpoint on that metric:
the difference with its CI, the Holm-corrected paired test and the minimum detectable effect, all from
`ckpteval.results.compare.compare` (nothing is recomputed here). The rows are kept in the iteration's entry
(`entry.verdicts["previous"|"best"]`) for `watch status`, the W&B curves and `evaluate report --watch`.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckpteval.results.compare import InvocationSamples, MetricComparison
    from ckpteval.watch.state import IterationEntry, WatchState

NO_DIFFERENCE = "no detectable difference"
# a verdict as a number, for a W&B panel: +1 better, -1 worse, 0 no detectable difference
VERDICT_CODE = {"better": 1, "worse": -1, NO_DIFFERENCE: 0}
AGAINST = ("previous", "best")


def judge(
    state: WatchState,
    entry: IterationEntry,
    *,
    load: Callable[[str], InvocationSamples] | None = None,
    resamples: int = 2_000,
) -> None:
    """Compare `entry` (just succeeded) with the previous succeeded checkpoint and the best so far; its
    `verdicts` are set (empty for the first checkpoint). `load` reads an invocation's per-sample scores."""
    from ckpteval.results.compare import compare

    if load is None:
        from ckpteval.api import invocation_samples

        load = invocation_samples
    reader = load
    earlier = sorted(
        (e for e in state.iterations.values() if e.iteration < entry.iteration and e.state == "succeeded"),
        key=lambda e: e.iteration,
    )
    entry.verdicts = {}
    if not earlier or entry.current is None:
        return
    samples: dict[int, InvocationSamples] = {}

    def of(e: IterationEntry) -> InvocationSamples:
        if e.iteration not in samples:
            assert e.current is not None
            samples[e.iteration] = reader(e.current.invocation)
        return samples[e.iteration]

    this = of(entry)
    previous = earlier[-1]
    rows = compare(of(previous), [this], resamples=resamples).rows
    entry.verdicts["previous"] = [_row(r, previous.iteration) for r in rows]
    best_rows = []
    for key in (k for k in entry.metrics if _is_score(k)):
        task, _, metric = key.partition("/")
        scored = [e for e in earlier if key in e.metrics]
        if not scored:
            continue
        best = max(scored, key=lambda e: (e.metrics[key], -e.iteration))
        pair = rows if best is previous else compare(of(best), [this], resamples=resamples).rows
        best_rows += [_row(r, best.iteration) for r in pair if r.task == task and r.metric == metric]
    entry.verdicts["best"] = best_rows


def _row(row: MetricComparison, against: int) -> dict[str, Any]:
    from ckpteval.results.compare import NO_EVIDENCE

    return {
        "task": row.task,
        "metric": row.metric,
        "against": against,
        "baseline": row.baseline_value,
        "value": row.candidate_value,
        "delta": row.difference,
        "ci_low": row.ci_low,
        "ci_high": row.ci_high,
        "n": row.n,
        "p_adjusted": row.p_adjusted,
        "mde": row.mde,
        "verdict": NO_DIFFERENCE if row.verdict == NO_EVIDENCE else row.verdict,
        "tested": row.p_value is not None,
        "note": row.note,
    }


def describe(row: dict[str, Any]) -> str:
    """One row in words: `hellaswag acc +0.031 [+0.004, +0.058] better than iteration 20`."""
    head = f"{row['task']} {row['metric']}"
    if not row["tested"]:
        return f"{head}: not tested against iteration {row['against']} ({row['note'] or 'no per-sample scores'})"
    text = (
        f"{head} {_signed(row['delta'])} [{_signed(row['ci_low'])}, {_signed(row['ci_high'])}] "
        f"vs iteration {row['against']}: {row['verdict']}"
    )
    if row["verdict"] == NO_DIFFERENCE and row["mde"] is not None:
        text += f" (detectable: ±{row['mde']:.3g} at n={row['n']})"
    return text


def verdict_lines(entry: IterationEntry) -> list[str]:
    """The entry's verdicts, one line per comparison (`vs previous` / `vs best`)."""
    out = []
    for against in AGAINST:
        for row in entry.verdicts.get(against, []):
            out.append(f"vs {against}: {describe(row)}")
    return out


def verdict_metrics(entry: IterationEntry) -> dict[str, float]:
    """The verdicts as step-indexed metrics: `<task>/<metric>/vs_<previous|best>/{delta,ci_low,ci_high,
    mde,verdict}` (verdict: +1 better, -1 worse, 0 no detectable difference)."""
    out: dict[str, float] = {}
    for against in AGAINST:
        for row in entry.verdicts.get(against, []):
            if not row["tested"]:
                continue
            base = f"{row['task']}/{row['metric']}/vs_{against}"
            for name in ("delta", "ci_low", "ci_high", "mde"):
                if row[name] is not None:
                    out[f"{base}/{name}"] = float(row[name])
            out[f"{base}/verdict"] = float(VERDICT_CODE[row["verdict"]])
    return out


def _is_score(key: str) -> bool:
    return not key.endswith(("_stderr", "/n_samples", "_std_dev"))


def _signed(v: float | None) -> str:
    return "—" if v is None else f"{v:+.3g}"
