"""Per-document answers of a recorded invocation, and the flips between two invocations: which documents the
candidate got wrong that the baseline got right (and the other way), with what each one answered.

Read from each task's `samples.jsonl` (see `ckpteval.results.samples`). A document's score is its primary
metric's (the task's first metric with per-sample scores, unless one is named); a repeated task's document
scores the mean of its repeats. A document is *right* when that score is above 0.5: for a 0/1 metric, when it
scored 1; for a repeated task, when most of its repeats did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ckpteval.errors import ConfigError
from ckpteval.results.compare import InvocationSamples
from ckpteval.results.samples import SampleScore, doc_scores, metric_names

RIGHT_ABOVE = 0.5


@dataclass(frozen=True)
class DocumentAnswer:
    """One document of one task in one invocation: what the model saw and said, and how it scored."""

    task: str  # the invocation's task (adlr_mmlu), not the harness's subtask
    sample: str  # the harness's id of the document: `<subtask>/<doc id>`
    doc: str  # the document's identity (SHA-256), what pairs it across invocations
    metric: str
    score: float  # the metric's score (the mean over repeats for a repeated task)
    prompt: str | None
    response: str | None  # what the model said (multiple choice: the choice it scored highest)
    answer: str | None  # the answer extracted from the response, the one the metric scored
    target: str | None
    repeats: int = 1  # rows behind the score

    @property
    def right(self) -> bool:
        return self.score > RIGHT_ABOVE

    @property
    def key(self) -> tuple[str, str]:
        """What pairs it with the same document in another invocation: (harness subtask, document)."""
        return (self.sample.rsplit("/", 1)[0], self.doc)

    @property
    def shown_answer(self) -> str | None:
        """The extracted answer, or the response where the task extracts none."""
        return self.answer if self.answer is not None else self.response

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "right": self.right}


@dataclass(frozen=True)
class Flip:
    """A document both invocations scored, with different scores."""

    baseline: DocumentAnswer
    candidate: DocumentAnswer

    @property
    def change(self) -> float:
        """candidate - baseline (negative: the candidate lost it)."""
        return self.candidate.score - self.baseline.score

    @property
    def kind(self) -> str:
        """`right → wrong`, `wrong → right`, or `lower`/`higher` where the right/wrong call did not change."""
        if self.baseline.right != self.candidate.right:
            return "right → wrong" if self.baseline.right else "wrong → right"
        return "lower" if self.change < 0 else "higher"

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.baseline.task,
            "sample": self.candidate.sample,
            "doc": self.baseline.doc,
            "metric": self.baseline.metric,
            "kind": self.kind,
            "change": self.change,
            "baseline": self.baseline.to_json(),
            "candidate": self.candidate.to_json(),
        }


def answer_tasks(invocation: InvocationSamples, task: str | None = None) -> list[str]:
    """The tasks whose answers can be shown (`task`, or every task with per-sample scores); a task the
    invocation did not run, or ran without per-sample output, is a ConfigError that says which tasks it has."""
    ran = list(invocation.results.tasks)
    if task is None:
        return [t for t in ran if t in invocation.samples]
    if task not in invocation.results.tasks:
        raise ConfigError(
            f"Invocation {invocation.name} has no task {task!r}.",
            hint=f"Its tasks: {', '.join(ran) or 'none'}.",
        )
    if task not in invocation.samples:
        outcome = invocation.results.tasks[task]
        why = "it did not succeed" if outcome.status != "succeeded" else "its harness kept no per-sample output"
        raise ConfigError(f"Task {task} of invocation {invocation.name} has no per-sample answers: {why}.")
    return [task]


def primary_metric(invocation: InvocationSamples, task: str) -> str | None:
    """The task's first metric (in results.json order) with per-sample scores."""
    rows = invocation.samples.get(task, [])
    scored = metric_names(rows)
    outcome = invocation.results.tasks.get(task)
    listed = [m for m in (outcome.metrics if outcome else {}) if m in scored]
    return next(iter(listed or scored), None)


def document_answers(invocation: InvocationSamples, task: str, metric: str | None = None) -> list[DocumentAnswer]:
    """Every document of `task` with its answer and score on `metric` (default: the primary metric), in the
    harness's order."""
    rows = invocation.samples.get(task, [])
    metric = metric or primary_metric(invocation, task)
    if metric is None:
        return []
    if metric not in metric_names(rows):
        raise ConfigError(
            f"Task {task} of invocation {invocation.name} has no per-sample scores of {metric!r}.",
            hint=f"Its per-sample metrics: {', '.join(metric_names(rows))}.",
        )
    scores = doc_scores(rows, metric)
    first: dict[tuple[str, str], SampleScore] = {}
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        if metric in row.scores:
            first.setdefault(row.key, row)
            counts[row.key] = counts.get(row.key, 0) + 1
    return [
        DocumentAnswer(
            task=task,
            sample=row.sample,
            doc=row.doc,
            metric=metric,
            score=scores[key],
            prompt=row.prompt,
            response=row.response,
            answer=row.answer,
            target=row.target,
            repeats=counts[key],
        )
        for key, row in first.items()
    ]


def flips(
    baseline: InvocationSamples, candidate: InvocationSamples, task: str, metric: str | None = None
) -> list[Flip]:
    """The documents of `task` both invocations scored whose score changed, worst first (the candidate's
    biggest losses, then its smaller ones, then its gains)."""
    metric = metric or primary_metric(baseline, task)
    if metric is None:
        return []
    theirs = {a.key: a for a in document_answers(candidate, task, metric)}
    out = [
        Flip(mine, theirs[mine.key])
        for mine in document_answers(baseline, task, metric)
        if mine.key in theirs and theirs[mine.key].score != mine.score
    ]
    return sorted(out, key=lambda f: f.change)  # stable: documents keep the harness's order within a change


def common_documents(baseline: InvocationSamples, candidate: InvocationSamples, task: str) -> int:
    """How many documents of `task` both invocations scored."""
    return len({r.key for r in baseline.samples.get(task, [])} & {r.key for r in candidate.samples.get(task, [])})


def filter_answers(answers: Sequence[DocumentAnswer], *, right: bool | None) -> list[DocumentAnswer]:
    """The right ones (`right=True`), the wrong ones (`False`), or all (`None`)."""
    return [a for a in answers if right is None or a.right == right]


def shorten(text: str | None, width: int, *, keep_end: bool = False) -> str:
    """`text` on one line (whitespace collapsed), at most `width` characters: its start, or its end where the
    point is at the end (a few-shot prompt's question)."""
    if text is None:
        return ""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    return "…" + flat[-(width - 1) :] if keep_end else flat[: width - 1] + "…"


@dataclass(frozen=True)
class TaskFlips:
    """The flips of one task between the baseline and one candidate."""

    task: str
    baseline: str
    candidate: str
    metric: str
    common: int  # documents both scored
    flips: list[Flip]

    @property
    def lost(self) -> int:
        return sum(1 for f in self.flips if f.kind == "right → wrong")

    @property
    def gained(self) -> int:
        return sum(1 for f in self.flips if f.kind == "wrong → right")


def comparison_flips(baseline: InvocationSamples, candidates: Sequence[InvocationSamples]) -> list[TaskFlips]:
    """For each candidate and each task it shares with the baseline (both with per-sample answers), the flips
    on the task's primary metric, worst first."""
    out = []
    for candidate in candidates:
        for task in answer_tasks(baseline):
            metric = primary_metric(baseline, task)
            if task not in candidate.samples or metric is None or metric not in metric_names(candidate.samples[task]):
                continue
            out.append(
                TaskFlips(
                    task=task,
                    baseline=baseline.name,
                    candidate=candidate.name,
                    metric=metric,
                    common=common_documents(baseline, candidate, task),
                    flips=flips(baseline, candidate, task, metric),
                )
            )
    return out
