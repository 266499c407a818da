"""The score table: one row per task metric (and evaluation mode, for repeated sampling); several
invocations side by side.

Tasks scored on offline stand-in data (a different split, or few-shot examples from elsewhere) carry a
mark and a footnote, so no one mistakes an offline smoke score for the published number.
"""

from __future__ import annotations

from collections.abc import Sequence

from ckpteval.results.model import InvocationResults, Metric, TaskOutcome

OFFLINE_MARK = "†"
FAILED_MARK = "✗"
# below this many documents a standard error says nothing (2 documents both wrong: ± 0.0000)
MIN_N_FOR_CI = 10
TOO_FEW = "n too small for a CI"
JUDGE_ERRORS_ROW = "judge errors"  # the row under a judge-scored task's scores
NOT_COUNTED = "not counted"  # a judged task whose harness does not count its judge's failures


# the metrics a chance level applies to: the share of documents answered right (lm-eval's names)
CHANCE_METRICS = ("acc", "acc_norm", "exact_match")
Z_95 = 1.959964


def chance_text(name: str, metric: Metric, chance: float | None) -> str:
    """What guessing would score beside `metric` (`name` as results.json has it): `chance 0.25`, or `at chance:
    0.25` where the score's 95% CI includes it; "" for a task that is no choice, or a metric that is no accuracy."""
    if chance is None or name.partition("__")[0] not in CHANCE_METRICS:
        return ""
    level = f"{chance:.4g}"
    few = metric.n_samples is not None and metric.n_samples < MIN_N_FOR_CI
    if not few and metric.stderr is not None and abs(metric.value - chance) <= Z_95 * metric.stderr:
        return f"at chance: {level}"
    return f"chance {level}"


def _fmt(metric: Metric | None, name: str = "", chance: float | None = None) -> str:
    if metric is None:
        return "—"
    text = f"{metric.value:.4f}"
    notes = []
    if metric.n_samples is not None and metric.n_samples < MIN_N_FOR_CI:
        notes.append(TOO_FEW)
    elif metric.stderr is not None:
        text += f" ± {metric.stderr:.4f}"
    notes.append(chance_text(name, metric, chance))
    said = "; ".join(n for n in notes if n)
    return f"{text} ({said})" if said else text


def usage_note(result: InvocationResults, *, several: bool = False) -> str:
    """The footer line of what an invocation cost: "used 0.012 GPU-h (1 GPU × 43 s): start-up 20, tasks 20, idle
    3 s" (on the CPU: its wall time and CPU-seconds per second); from `results.usage`."""
    from ckpteval.results.usage import Usage

    usage = Usage.from_json(result.usage or {})
    who = f"{result.label or result.invocation} " if several else ""
    phases = ", ".join(f"{_PHASE_WORDS.get(k, k)} {v:.0f}" for k, v in usage.phases.items())
    kept = "; loaded in place into the watcher's deployment" if usage.deployment == "kept" else ""
    label = usage.label()
    if usage.source == "sacct":
        label = label[:-1] + ", sacct)" if label.endswith(")") else label + " (sacct)"
    return f"{who}used {label}" + (f": {phases} s" if phases else "") + kept


_PHASE_WORDS = {"startup": "start-up", "tasks": "tasks", "idle": "idle"}


def table_rows(results: Sequence[InvocationResults]) -> tuple[list[str], list[list[str]], list[str]]:
    """(header, rows, footnotes) of the score table for one or more invocations.

    When a task was sampled several times, the table gets a `mode` column and that task one row per
    evaluation mode and metric (pass@1[avg-of-k], majority@k, pass@k), the way NeMo-Skills' summary
    shows them; greedy tasks then read `greedy` there. Without repeated tasks there is no mode column.
    """
    with_modes = any(o.repeats for r in results for o in r.tasks.values())
    # each invocation's score, then the number of documents it was scored on (two runs of a task may have
    # scored different numbers of documents)
    names = [col for r in results for col in (r.label or r.invocation, "n")]
    header = ["task", *(["mode"] if with_modes else []), "metric", *names]
    task_names: list[str] = []
    for r in results:
        task_names.extend(t for t in r.tasks if t not in task_names)
    rows: list[list[str]] = []
    footnotes: list[str] = []
    for task in task_names:
        outcomes = [r.tasks.get(task) for r in results]
        label = task
        offline = next((o for o in outcomes if o and o.data and o.data.offline), None)
        if offline and offline.data:
            label = f"{task} {OFFLINE_MARK}"
            footnotes.append(_offline_note(task, offline))
        failures = (_failure_note(task, o, r, several=len(results) > 1) for o, r in zip(outcomes, results, strict=True))
        footnotes.extend(note for note in failures if note)
        judged = (_judge_note(task, o, r, several=len(results) > 1) for o, r in zip(outcomes, results, strict=True))
        footnotes.extend(note for note in judged if note)
        pairs = _mode_metric_pairs(outcomes, with_modes)
        if not pairs:
            lead = [label, *([""] if with_modes else []), _status_text(outcomes)]
            rows.append([*lead, *(cell for _ in outcomes for cell in ("—", ""))])
        previous_mode = None
        for i, (mode, metric) in enumerate(pairs):
            values = [
                cell for o in outcomes for cell in (_cell(o, mode, metric, with_modes), _n(o, mode, metric, with_modes))
            ]
            mode_cell = [mode if mode != previous_mode else ""] if with_modes else []
            rows.append([label if i == 0 else "", *mode_cell, metric, *values])
            previous_mode = mode
        counted = [_judge_errors_cell(task, o, r) for o, r in zip(outcomes, results, strict=True)]
        if any(counted):  # beside the score: how many of the judge's replies held no rating
            rows.append(
                ["", *([""] if with_modes else []), JUDGE_ERRORS_ROW, *(c for cell in counted for c in (cell, ""))]
            )
    if with_modes:
        footnotes.append(REPEATS_NOTE)
    footnotes.extend(usage_note(r, several=len(results) > 1) for r in results if r.usage)
    from ckpteval.results.caveats import caveat_notes

    footnotes.extend(caveat_notes(results))  # last: what the numbers cannot be trusted for
    return header, rows, footnotes


REPEATS_NOTE = (
    "k samples per problem: pass@1[avg-of-k] is the mean score of one sample (± the standard error across the "
    "k runs), majority@k the score of the most common answer, pass@k the chance that one of k samples is right"
)


def _offline_note(task: str, outcome: TaskOutcome) -> str:
    d = outcome.data
    assert d is not None
    parts = [
        p
        for p in (
            d.source,
            f"split {d.split}" if d.split else None,
            f"few-shot from {d.few_shot_source}" if d.few_shot_source else None,
            d.note,
        )
        if p
    ]
    return f"{OFFLINE_MARK} {task}: offline data — " + "; ".join(parts)


def _judge_note(task: str, outcome: TaskOutcome | None, results: InvocationResults, *, several: bool) -> str:
    """Who judged a judge-scored task, and how many of its judgments failed ("judge errors 1 of 80")."""
    judge = results.provenance.judge if results.provenance else None
    if outcome is None or not judge or task not in (judge.get("tasks") or ()):
        return ""
    which = f" ({results.label or results.invocation})" if several else ""
    who = " ".join(str(v) for v in (judge.get("kind"), judge.get("model_id"), judge.get("url")) if v)
    note = f"{task}{which}: judged by {who}"
    if outcome.judge_errors is not None:
        counted = outcome.judge_errors
        note += f"; {counted.text()} (judgments with no rating after the harness's retries)"
    elif outcome.status == "succeeded":
        note += "; its harness does not count the judge's failed replies"
    return note


def _judge_errors_cell(task: str, outcome: TaskOutcome | None, results: InvocationResults) -> str:
    """`3 of 80`; `not counted` for a judged task that scored without its harness counting them; "" else."""
    if outcome is None:
        return ""
    if outcome.judge_errors is not None:
        return f"{outcome.judge_errors.errors} of {outcome.judge_errors.judgments}"
    judge = results.provenance.judge if results.provenance else None
    judged = bool(judge) and task in (judge.get("tasks") or ())  # type: ignore[union-attr]
    return NOT_COUNTED if judged and outcome.status == "succeeded" else ""


def _failure_note(task: str, outcome: TaskOutcome | None, results: InvocationResults, *, several: bool) -> str:
    """Why a task failed, where its log is and what to do: the table alone says only `failed`."""
    if outcome is None or outcome.status != "failed" or not outcome.error:
        return ""
    which = f" ({results.label or results.invocation})" if several else ""
    parts = [f"{FAILED_MARK} {task}{which} failed: {outcome.error}"]
    if outcome.log:
        parts.append(f"  log: {outcome.log}")
    if outcome.hint:
        parts.append(f"  hint: {outcome.hint}")
    return "\n".join(parts)


def _mode_metric_pairs(outcomes: Sequence[TaskOutcome | None], with_modes: bool) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for o in outcomes:
        if o is None:
            continue
        if not with_modes:
            pairs.extend(("", m) for m in o.metrics if ("", m) not in pairs)
            continue
        for mode, metrics in o.evaluation_modes().items():
            pairs.extend((mode, m) for m in metrics if (mode, m) not in pairs)
    # group rows by mode in first-seen order (another invocation may add metrics to an earlier mode)
    order = list(dict.fromkeys(mode for mode, _ in pairs))
    return sorted(pairs, key=lambda p: order.index(p[0]))


def _lookup(outcome: TaskOutcome | None, mode: str, metric: str, with_modes: bool) -> Metric | None:
    if outcome is None:
        return None
    if not with_modes:
        return outcome.metrics.get(metric)
    return outcome.evaluation_modes().get(mode, {}).get(metric)


def _cell(outcome: TaskOutcome | None, mode: str, metric: str, with_modes: bool) -> str:
    if outcome is None or outcome.status != "succeeded":
        return _status_cell(outcome)
    return _fmt(_lookup(outcome, mode, metric, with_modes), metric, outcome.chance)


def _n(outcome: TaskOutcome | None, mode: str, metric: str, with_modes: bool) -> str:
    """The number of documents behind this invocation's score ('' where it has none)."""
    if outcome is None or outcome.status != "succeeded":
        return ""
    m = _lookup(outcome, mode, metric, with_modes)
    return "" if m is None or m.n_samples is None else str(m.n_samples)


def _status_cell(outcome: TaskOutcome | None) -> str:
    return "—" if outcome is None else outcome.status


def _status_text(outcomes: Sequence[TaskOutcome | None]) -> str:
    return ", ".join(sorted({o.status for o in outcomes if o})) or "—"


def render_text(results: Sequence[InvocationResults]) -> str:
    """The table as plain aligned text (golden-tested; what `--plain` and logs show; `ckpteval.cli.table`
    draws the same rows with rich)."""
    header, rows, footnotes = table_rows(results)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip(),
        "-+-".join("-" * w for w in widths),
    ]
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines + footnotes) + "\n"
