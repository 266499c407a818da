"""Per-sample scores of a task, normalized: `tasks/<task>/samples.jsonl`, whatever harness produced them.

One line per scored document (and repeat, for a task sampled several times):

```json
{"sample": "mmlu_str_anatomy/0", "task": "mmlu_str_anatomy", "doc": "4f1c...", "repeat": null,
 "scores": {"exact_match": 1.0}}
```

- `sample`: the harness's own id of the item (its leaf task and document id);
- `doc`: the document's identity, a SHA-256 of the document itself (lm-eval's `doc_hash`), so two
  invocations are matched item by item even when they ran different subsets or orders;
- `repeat`: the repeat's index (its seed) for a repeated task, null for a greedy one;
- `scores`: every per-sample metric under its results.json name (`exact_match__strict-match`);
- `choices` (a choice task's): how many answers a guess picks among, which gives the task's chance level;
- `prompt`, `response`, `answer`, `target` (where the harness logged them): the prompt the model saw, what it
  said (a multiple-choice task: the choice it scored highest), the answer the task extracted from that (the
  one its metric scored) and the target, each whole (`samples --json` and the Inspect export pass them on
  unshortened; only the terminal's table shortens them for display).

The file is written when results are collected (`ckpteval.results.collect`); `evaluate compare` pairs
invocations on it, and results.json takes the standard error of a metric from it where the harness gave
none.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.errors import EvaluationError
from ckpteval.invocation.jobdir import JobDir
from ckpteval.results.model import TaskOutcome

SAMPLES_FILE = JobDir.SAMPLES


@dataclass(frozen=True)
class SampleScore:
    """One document's per-metric scores in one run of a task."""

    task: str  # the harness's (leaf) task, e.g. mmlu_str_anatomy
    doc_id: int | str
    doc: str  # the document's identity (SHA-256 of the document)
    scores: dict[str, float]
    repeat: int | None = None
    prompt: str | None = None
    response: str | None = None
    answer: str | None = None
    target: str | None = None
    choices: int | None = None  # a choice task's number of answers to pick among (`tasks.samples.choice_count`)

    @property
    def sample(self) -> str:
        return f"{self.task}/{self.doc_id}"

    @property
    def key(self) -> tuple[str, str]:
        """What pairs a sample with the same item in another invocation."""
        return (self.task, self.doc)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sample": self.sample,
            "task": self.task,
            "doc": self.doc,
            "repeat": self.repeat,
            "scores": self.scores,
        }
        if self.choices is not None:
            out["choices"] = self.choices
        for name in TEXT_FIELDS:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


TEXT_FIELDS = ("prompt", "response", "answer", "target")


def task_sample_scores(task_dir: Path, harness_task: str, repeats: int = 0) -> list[SampleScore]:
    """Every per-sample score of a task's run(s) (each repeat of a repeated task) from the harness output.

    lm-eval writes one line per document and filter; they become one `SampleScore` per document.
    Raises EvaluationError when the harness kept no per-sample output.
    """
    from ckpteval.tasks.repeats import run_layouts
    from ckpteval.tasks.samples import read_sample_lines

    out: list[SampleScore] = []
    for layout in run_layouts(repeats):
        merged: dict[tuple[str, int | str], SampleScore] = {}
        for line in read_sample_lines(task_dir / layout.output, harness_task):
            key = (line.task, line.doc_id)
            if key not in merged:  # a document's first filter gives its answer (gsm8k: strict-match)
                text = line.text
                merged[key] = SampleScore(
                    line.task,
                    line.doc_id,
                    line.doc_hash,
                    {},
                    layout.repeat,
                    prompt=text.prompt if text else None,
                    response=text.response if text else None,
                    answer=line.answer,
                    target=text.target if text else None,
                    choices=line.choices,
                )
            merged[key].scores.update(line.scores)
        out.extend(merged.values())
    return out


def write_samples(path: Path, rows: Iterable[SampleScore]) -> Path:
    """Write a samples.jsonl (temp file + rename: never half-written)."""
    from ckpteval.invocation.record import write_text_atomic

    write_text_atomic(path, "".join(json.dumps(r.to_json(), ensure_ascii=False) + "\n" for r in rows))
    return path


def read_samples(path: Path) -> list[SampleScore]:
    """Load a samples.jsonl; a line that is not a sample record is an EvaluationError naming it."""
    rows = []
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EvaluationError(f"{path} does not exist.") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            scores = {str(k): float(v) for k, v in raw["scores"].items()}
            repeat = raw.get("repeat")
            task = str(raw["task"])
            doc_id = str(raw["sample"]).removeprefix(f"{task}/")
            texts = {name: _opt_str(raw.get(name)) for name in TEXT_FIELDS}
            rows.append(
                SampleScore(
                    task,
                    int(doc_id) if doc_id.isdigit() else doc_id,
                    str(raw["doc"]),
                    scores,
                    _opt_int(repeat),
                    **texts,
                    choices=_opt_int(raw.get("choices")),
                )
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EvaluationError(f"{path}:{number} is not a ckpteval sample record ({exc}).") from None
    return rows


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def doc_scores(rows: Sequence[SampleScore], metric: str) -> dict[tuple[str, str], float]:
    """Document -> score of `metric`; a repeated task's document gets the mean of its repeats (the
    per-document pass@1[avg-of-k])."""
    sums: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if metric in row.scores:
            sums.setdefault(row.key, []).append(row.scores[metric])
    return {key: sum(values) / len(values) for key, values in sums.items()}


def metric_names(rows: Sequence[SampleScore]) -> list[str]:
    """The metrics with per-sample scores, in first-seen order."""
    return list(dict.fromkeys(name for row in rows for name in row.scores))


def chance_level(rows: Sequence[SampleScore]) -> float | None:
    """The score a uniform guess gets on these documents: the mean over documents of 1 / its number of
    choices (MMLU: 0.25). None unless every document is a choice among a known number of answers."""
    per_doc = {row.key: row.choices for row in rows}
    if not per_doc or any(not k or k < 2 for k in per_doc.values()):
        return None
    return sum(1 / k for k in per_doc.values() if k) / len(per_doc)


def standard_error(values: Sequence[float]) -> float | None:
    """Standard error of a mean: sample standard deviation (n - 1) / sqrt(n); None below two values."""
    if len(values) < 2:
        return None
    return statistics.stdev(values) / math.sqrt(len(values))


def with_sample_stderr(outcome: TaskOutcome, rows: Sequence[SampleScore]) -> TaskOutcome:
    """The outcome with every greedy metric's missing stderr and n_samples taken from its per-sample scores.

    A repeated task's metrics already carry theirs (see `ckpteval.tasks.passk`).
    """
    if outcome.repeats or not rows:
        return outcome
    metrics = dict(outcome.metrics)
    for name, metric in outcome.metrics.items():
        values = list(doc_scores(rows, name).values())
        if not values:
            continue
        stderr = metric.stderr if metric.stderr is not None else standard_error(values)
        n = metric.n_samples if metric.n_samples is not None else len(values)
        metrics[name] = dataclasses.replace(metric, stderr=stderr, n_samples=n)
    n_samples = outcome.n_samples
    if n_samples is None:
        n_samples = next((m.n_samples for m in metrics.values() if m.n_samples is not None), None)
    return dataclasses.replace(outcome, metrics=metrics, n_samples=n_samples)
