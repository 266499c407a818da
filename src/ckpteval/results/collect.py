"""Gather a finished (or interrupted) job's outcome from its directory into `InvocationResults`."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from ckpteval.errors import EvaluationError
from ckpteval.results.model import DataSource, InvocationResults, JudgeErrors, Metric, TaskOutcome
from ckpteval.results.provenance import Provenance
from ckpteval.tasks.repeats import REPEATS_FILE
from ckpteval.tasks.results import OfflineData


def task_outcome(task_dir: Path, name: str) -> TaskOutcome:
    """One task's outcome from its state file and the harness output under `task_dir/output` (a
    repeated task: `output-rs<i>` for each repeat), with its judge errors where its harness counted them."""
    outcome = _task_outcome(task_dir, name)
    judged = judge_errors(task_dir)
    return dataclasses.replace(outcome, judge_errors=judged) if judged else outcome


def judge_errors(task_dir: Path) -> JudgeErrors | None:
    """The judge errors the harness hook counted in each output dir of the task (`output`, `output-rs<i>`),
    summed; None when none was counted (no judge, or a harness that does not count them)."""
    import json

    from ckpteval.tasks.harness_hook.ckpteval_judge import JUDGE_ERRORS_FILE

    found = []
    for path in sorted(task_dir.glob(f"output*/{JUDGE_ERRORS_FILE}")):
        try:
            found.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    found = [f for f in found if isinstance(f, dict)]
    if not found:
        return None
    rate = found[0].get("max_error_rate")
    return JudgeErrors(
        errors=sum(int(f.get("errors") or 0) for f in found),
        judgments=sum(int(f.get("judgments") or 0) for f in found),
        max_error_rate=float(rate) if isinstance(rate, (int, float)) else None,
    )


def _task_outcome(task_dir: Path, name: str) -> TaskOutcome:
    from ckpteval.tasks.repeats import read_repeats

    state_file = task_dir / "state"
    state = state_file.read_text().strip() if state_file.exists() else ""
    done = (task_dir / ".done").exists()
    repeats = read_repeats((task_dir / REPEATS_FILE).read_text() if (task_dir / REPEATS_FILE).is_file() else None)
    if repeats:
        return _repeated_outcome(task_dir, name, repeats, state=state, done=done)
    if done:
        from ckpteval.tasks.results import read_task_result

        try:
            result = read_task_result(task_dir / "output")
        except EvaluationError as exc:
            return TaskOutcome(name=name, status="failed", error=exc.message)
        metrics = {k: Metric(value=m.value, stderr=m.stderr, n_samples=m.n_samples) for k, m in result.metrics.items()}
        outcome = TaskOutcome(
            name=name,
            status="succeeded",
            harness=result.harness_task,
            metrics=metrics,
            n_samples=result.n_samples,
            data=_data_source(result.offline),
            duration_s=result.timings.runtime_s,
        )
        return _with_samples(task_dir, outcome)
    if state.startswith("failed"):
        from ckpteval.tasks.failure import explain_failure

        why = explain_failure(task_dir / "output", task_dir / "client.log")
        return TaskOutcome(name=name, status="failed", error=why.reason, log=why.log, hint=why.hint)
    if state == "running":
        return TaskOutcome(name=name, status="cancelled", error="the job stopped while this task ran")
    return TaskOutcome(name=name, status="pending")


def _data_source(offline: OfflineData | None) -> DataSource | None:
    if offline is None:
        return None
    return DataSource(
        offline=True,
        source=", ".join(offline.sources),
        split=offline.eval_split,
        few_shot_source=offline.few_shot_source,
        n_available=offline.n_available,
        note=offline.note,
    )


def _repeated_outcome(task_dir: Path, name: str, repeats: int, *, state: str, done: bool) -> TaskOutcome:
    """A task sampled `repeats` times: every evaluation mode from the runs' per-sample scores."""
    from ckpteval.tasks.failure import explain_failure
    from ckpteval.tasks.passk import repeated_scores
    from ckpteval.tasks.repeats import run_layouts
    from ckpteval.tasks.results import read_task_result
    from ckpteval.tasks.samples import read_run_samples

    layouts = run_layouts(repeats)
    if not done:
        finished = sum((task_dir / layout.done).exists() for layout in layouts)
        progress = f"{finished} of {repeats} repeats finished"
        if state.startswith("failed"):
            failed = next((layout for layout in layouts if not (task_dir / layout.done).exists()), layouts[-1])
            why = explain_failure(task_dir / failed.output, task_dir / failed.log)
            return TaskOutcome(
                name=name,
                status="failed",
                repeats=repeats,
                error=f"repeat {failed.repeat}: {why.reason} ({progress})",
                log=why.log,
                hint=why.hint,
            )
        if state == "running":
            return TaskOutcome(
                name=name,
                status="cancelled",
                repeats=repeats,
                error=f"the job stopped while this task ran ({progress})",
            )
        return TaskOutcome(name=name, status="pending", repeats=repeats)
    try:
        results = [read_task_result(task_dir / layout.output, log_path=task_dir / layout.log) for layout in layouts]
        harness_task = results[0].harness_task
        runs = [read_run_samples(task_dir / layout.output, harness_task) for layout in layouts]
        modes: dict[str, dict[str, Metric]] = {}
        for metric in sorted(runs[0], key=_metric_order(results[0].metrics)):
            scores = repeated_scores([run.get(metric, {}) for run in runs])
            for mode, score in scores.items():
                modes.setdefault(mode, {})[metric] = Metric(
                    value=score.value, stderr=score.stderr, n_samples=score.n_problems, std_dev=score.std_dev
                )
    except EvaluationError as exc:
        return TaskOutcome(name=name, status="failed", repeats=repeats, error=exc.message)
    except ValueError as exc:  # runs that do not cover the same problems
        return TaskOutcome(name=name, status="failed", repeats=repeats, error=f"The repeats of {name} disagree: {exc}.")
    if not modes:
        return TaskOutcome(
            name=name,
            status="failed",
            repeats=repeats,
            error=f"{name} has no per-sample metric to aggregate over repeats (lm-eval logged none in its samples).",
        )
    headline = next(iter(modes.values()))
    runtimes = [r.timings.runtime_s for r in results]
    outcome = TaskOutcome(
        name=name,
        status="succeeded",
        harness=harness_task,
        metrics=dict(headline),
        n_samples=next(iter(headline.values())).n_samples,
        data=_data_source(results[0].offline),
        duration_s=sum(t for t in runtimes if t is not None) if all(t is not None for t in runtimes) else None,
        repeats=repeats,
        modes=modes,
    )
    return _with_samples(task_dir, outcome)


def _with_samples(task_dir: Path, outcome: TaskOutcome) -> TaskOutcome:
    """Write the task's normalized per-sample scores (`samples.jsonl`) and take the stderr and n of its
    metrics from them where the harness gave none, and a choice task's chance level. A harness that kept no
    per-sample output leaves the outcome as it is (and no samples file)."""
    from ckpteval.results.samples import (
        SAMPLES_FILE,
        chance_level,
        task_sample_scores,
        with_sample_stderr,
        write_samples,
    )

    try:
        rows = task_sample_scores(task_dir, outcome.harness or outcome.name, outcome.repeats)
    except EvaluationError:
        return outcome
    if not rows:
        return outcome
    write_samples(task_dir / SAMPLES_FILE, rows)
    outcome = with_sample_stderr(outcome, rows)
    # a greedy choice task's chance level (a repeated task's pass@k has another)
    return outcome if outcome.repeats else dataclasses.replace(outcome, chance=chance_level(rows))


def _metric_order(lm_eval_metrics: Mapping[str, object]):
    """Metrics in the order lm-eval reports them (the order greedy tasks show), others after, by name."""
    known = list(lm_eval_metrics)
    return lambda name: (known.index(name) if name in known else len(known), name)


def collect_results(
    job_dir: Path,
    tasks: Sequence[tuple[str, str]],
    *,
    invocation: str,
    created: str,
    model: str | None,
    label: str | None = None,
) -> InvocationResults:
    """Every task's outcome, the invocation's status (succeeded only if every task did) and what produced
    the numbers (`provenance`)."""
    from ckpteval.results.provenance import read_provenance
    from ckpteval.results.usage import read_usage

    provenance = read_provenance(job_dir, tasks)
    usage = read_usage(
        job_dir,
        served_device=(provenance.checkpoint or {}).get("device"),
        deployment_kind=provenance.deployment.get("kind"),
    )
    outcomes = {name: task_outcome(job_dir / task_dir, name) for name, task_dir in tasks}
    outcomes = {name: refuse_unserved(outcome, provenance) for name, outcome in outcomes.items()}
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
        invocation=invocation,
        created=created,
        status=status,
        model=model,
        label=label,
        tasks=outcomes,
        provenance=provenance,
        usage=usage.to_json() if usage is not None else None,
    )


def refuse_unserved(outcome: TaskOutcome, provenance: Provenance) -> TaskOutcome:
    """A succeeded task is not scored (failed, saying why) when its numbers may not be the recorded
    checkpoint's (docs/results.md, "What was served"): the server loaded another iteration or directory than
    the one described before submission, or the task's answers (replayed ones included) came from more than
    one checkpoint content, or from another than the one the server reports."""
    if outcome.status != "succeeded":
        return outcome
    checkpoint = provenance.checkpoint or {}
    why = "; ".join(checkpoint.get("mismatch") or [])
    served = (provenance.tasks.get(outcome.name) or {}).get("served") or {}
    contents = served.get("checkpoints") or []
    loaded = checkpoint.get("files_sha256") if checkpoint.get("source") == "server" else None
    if not why and len(contents) > 1:
        why = f"its answers came from {len(contents)} checkpoint contents ({', '.join(c[:12] for c in contents)})"
    elif not why and loaded and contents and contents != [loaded]:
        why = f"its answers came from checkpoint content {contents[0][:12]}, the server reports {loaded[:12]}"
    if not why:
        return outcome
    return dataclasses.replace(
        outcome,
        status="failed",
        metrics={},
        modes={},
        error=f"Not scored: {why}.",
        hint="Run it again against one checkpoint (a new invocation); results.json's provenance says what was served.",
    )
