"""An invocation as Inspect evaluation logs (`evaluate export ID --to inspect`): one `.eval` log per task,
written with inspect-ai's own log writer, so `inspect view` opens them.

Each of the task's `samples.jsonl` rows becomes an Inspect sample: its prompt the input, the model's response
the output, the target, and one Score per metric (the row's own value, with the answer the metric scored).
A repeated task's rows are the epochs of their document. The log's results hold the task's aggregate metrics
from results.json: per metric, its value in each evaluation mode (`greedy`, or `pass@1[avg-of-k]`, ...) and
its standard error.

inspect-ai is an optional dependency (the `inspect` extra): it is imported only when a log is written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.errors import ExportError

if TYPE_CHECKING:
    from inspect_ai.log import EvalLog, EvalSample, EvalScore

    from ckpteval.results.compare import InvocationSamples
    from ckpteval.results.model import TaskOutcome
    from ckpteval.results.samples import SampleScore

INSTALL = "uv sync --extra inspect (or pip install 'ckpteval[inspect]')"


def require_inspect_ai() -> None:
    """An ExportError saying how to install inspect-ai, when it cannot be imported."""
    try:
        import inspect_ai  # noqa: F401
    except ImportError as exc:
        if exc.name == "inspect_ai":
            raise ExportError(f"Exporting to Inspect needs inspect-ai, not installed here: {INSTALL}.") from None
        raise ExportError(
            f"inspect-ai is installed but cannot be imported ({exc}): reinstall it with {INSTALL}."
        ) from None


def log_name(invocation: str, created: str, task: str) -> str:
    """The log's file name, as inspect names its own (`<created>_<task>_<task id>.eval`, no `_`, `/` or `:` in a
    part: its log list reads the task from the name); the same on every export, so exporting again replaces it."""

    def clean(part: str) -> str:
        return re.sub(r"[_/:]", "-", part)

    return f"{clean(created)}_{clean(task)}_{clean(invocation)}.eval"


def write_inspect_logs(loaded: InvocationSamples, out_dir: Path) -> dict[str, Path]:
    """Write one Inspect log per task with per-sample answers into `out_dir`; task -> the log written."""
    require_inspect_ai()
    from inspect_ai.log import write_eval_log

    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for task, rows in loaded.samples.items():
        path = out_dir / log_name(loaded.name, loaded.results.created, task)
        write_eval_log(task_log(loaded, task, rows), str(path), format="eval")
        written[task] = path
    return written


def task_log(loaded: InvocationSamples, task: str, rows: list[SampleScore]) -> EvalLog:
    """The Inspect log of one task: its spec, its aggregate results and a sample per row."""
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalResults, EvalSpec, EvalStats

    from ckpteval.results.provenance import provenance_summary

    results, outcome = loaded.results, loaded.results.tasks[task]
    model = results.model or results.label or "unknown"
    epochs = {r: i + 1 for i, r in enumerate(sorted({row.repeat for row in rows if row.repeat is not None}))}
    samples = [_sample(row, model, epochs.get(row.repeat, 1) if row.repeat is not None else 1) for row in rows]
    documents = len({row.sample for row in rows})
    spec = EvalSpec(
        run_id=results.invocation,
        created=results.created,
        task=task,
        task_id=results.invocation,
        dataset=EvalDataset(name=outcome.harness or task, samples=documents),
        model=model,
        config=EvalConfig(epochs=max(len(epochs), 1)),
        metadata=_without_none(
            {
                "ckpteval_invocation": results.invocation,
                "label": results.label,
                "harness": outcome.harness,
                "repeats": outcome.repeats or None,
                # what produced the numbers: checkpoint identity, tokenizer, deployment, settings (results.json)
                **{f"ckpteval_{k}": v for k, v in provenance_summary(results.provenance, task).items()},
            }
        ),
    )
    return EvalLog(
        status="success",
        eval=spec,
        results=EvalResults(total_samples=documents, completed_samples=documents, scores=_scores(outcome)),
        stats=EvalStats(started_at=results.created, completed_at=results.created),
        samples=samples,
    )


def _sample(row: SampleScore, model: str, epoch: int) -> EvalSample:
    from inspect_ai.log import EvalSample
    from inspect_ai.model import ChatMessageAssistant, ChatMessageUser, ModelOutput
    from inspect_ai.scorer import Score

    prompt, response = row.prompt or "", row.response or ""
    shown = row.answer if row.answer is not None else row.response
    return EvalSample(
        id=row.sample,
        epoch=epoch,
        input=prompt,
        target=row.target or "",
        messages=[ChatMessageUser(content=prompt), ChatMessageAssistant(content=response)],
        output=ModelOutput.from_content(model=model, content=response),
        scores={metric: Score(value=value, answer=shown) for metric, value in row.scores.items()},
        metadata=_without_none({"doc": row.doc, "harness_task": row.task, "repeat": row.repeat}),
    )


def _scores(outcome: TaskOutcome) -> list[EvalScore]:
    """Per metric of results.json: its value in each evaluation mode, and its standard error."""
    from inspect_ai.log import EvalMetric, EvalScore

    out = []
    for metric, aggregate in outcome.metrics.items():
        values = {mode: m[metric].value for mode, m in outcome.evaluation_modes().items() if metric in m}
        if aggregate.stderr is not None:
            values["stderr"] = aggregate.stderr
        out.append(
            EvalScore(
                name=metric,
                scorer=metric,
                reducer="mean" if outcome.repeats else None,
                metrics={name: EvalMetric(name=name, value=value) for name, value in values.items()},
            )
        )
    return out


def _without_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}
