"""Gather a finished (or interrupted) job's outcome from its directory into `InvocationResults`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ckpteval.errors import EvaluationError
from ckpteval.results.model import DataSource, InvocationResults, Metric, TaskOutcome


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def task_outcome(task_dir: Path, name: str) -> TaskOutcome:
    """One task's outcome from its state file and the harness output under `task_dir/output`."""
    state_file = task_dir / "state"
    state = state_file.read_text().strip() if state_file.exists() else ""
    done = (task_dir / ".done").exists()
    if done:
        from ckpteval.tasks.results import read_task_result

        try:
            result = read_task_result(task_dir / "output")
        except EvaluationError as exc:
            return TaskOutcome(name=name, status="failed", error=exc.message)
        metrics = {k: Metric(value=m.value, stderr=m.stderr, n_samples=m.n_samples) for k, m in result.metrics.items()}
        data = None
        if result.offline is not None:
            o = result.offline
            data = DataSource(
                offline=True,
                source=", ".join(o.sources),
                split=o.eval_split,
                few_shot_source=o.few_shot_source,
                n_available=o.n_available,
                note=o.note,
            )
        return TaskOutcome(
            name=name,
            status="succeeded",
            harness=result.harness_task,
            metrics=metrics,
            n_samples=result.n_samples,
            data=data,
            duration_s=result.timings.runtime_s,
        )
    if state.startswith("failed"):
        from ckpteval.tasks.results import failure_error

        error = failure_error(task_dir / "output", task_dir / "client.log").message
        return TaskOutcome(name=name, status="failed", error=error or _tail(task_dir / "client.log") or state)
    if state == "running":
        return TaskOutcome(name=name, status="cancelled", error="the job stopped while this task ran")
    return TaskOutcome(name=name, status="pending")


def collect_results(
    job_dir: Path,
    tasks: Sequence[tuple[str, str]],
    *,
    invocation: str,
    created: str,
    model: str | None,
    label: str | None = None,
) -> InvocationResults:
    """Every task's outcome, and the invocation's status (succeeded only if every task did)."""
    outcomes = {name: task_outcome(job_dir / task_dir, name) for name, task_dir in tasks}
    statuses = {o.status for o in outcomes.values()}
    if statuses == {"succeeded"}:
        status = "succeeded"
    elif "failed" in statuses:
        status = "failed"
    elif "cancelled" in statuses or "pending" in statuses:
        status = "cancelled"
    else:
        status = "failed"
    return InvocationResults(
        invocation=invocation, created=created, status=status, model=model, label=label, tasks=outcomes
    )
