"""What an export carries, the same for every destination: metrics, config, files.

- metrics: `<task>/<metric>` (the value), `<task>/<metric>_stderr`, `<task>/n_samples`, for every task
  that succeeded, and `<task>/<mode>/<metric>` for tasks sampled several times, `<task>/judge_errors` and
  `<task>/judge_judgments` for judged tasks whose harness counted them (see `metric_values`);
  W&B and MLflow both show `/` as a section separator.
- config: the compiled config as saved in `<job_dir>/config.yaml` (secrets already redacted there),
  plus a `ckpteval` block (invocation, model, label, status, task states, and results.json's `provenance`:
  what produced the numbers; MLflow, whose parameters are flat strings, gets its summary).
- files: `results.json`, `config.yaml`, `job.yaml`, and per task its `run_config.yml`, its normalized
  per-sample scores (`samples.jsonl`) and the harness output (results and metrics files, samples) — not
  caches, databases, locks, logs or hidden files.
- sample tables: per task, its per-sample scores as columns and rows (`sample_tables`): a W&B Table in the
  results artifact, an MLflow table artifact.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.errors import ExportError
from ckpteval.invocation.jobdir import JobDir
from ckpteval.results.model import InvocationResults, flat_metrics, judge_error_values
from ckpteval.results.samples import SAMPLES_FILE

CONFIG_FILE = JobDir.CONFIG
PROVENANCE_FILE = JobDir.PROVENANCE
RESULTS_FILE = JobDir.RESULTS
TASKS_DIR = JobDir.TASKS
# Harness output that is bulky and can be rebuilt, or that is not a result: never exported.
_EXCLUDED_SUFFIXES = (".db", ".lock", ".tmp", ".sqlite", ".sqlite3", ".log", ".pid")
_MAX_FILE_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class ExportContent:
    """One invocation's results, config and files, ready for any destination."""

    invocation: str
    results: InvocationResults
    config: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)  # name inside the artifact -> file on disk
    task_dirs: dict[str, str] = field(default_factory=dict)  # task name -> "tasks/<dir>" (when known)
    job_dir: Path | None = None

    def for_task(self, task: str) -> ExportContent:
        """The part of this content that belongs to one task (for per-task W&B runs): its metrics, the
        invocation-wide files, and that task's own files."""
        own = self.task_dirs.get(task)
        files = {
            name: path
            for name, path in self.files.items()
            if not name.startswith(f"{TASKS_DIR}/") or own is None or name.startswith(f"{own}/")
        }
        results = dataclasses.replace(
            self.results, status=self.results.tasks[task].status, tasks={task: self.results.tasks[task]}
        )
        return dataclasses.replace(self, results=results, files=files)


def metric_values(results: InvocationResults) -> dict[str, float]:
    """`<task>/<metric>`, `<task>/<metric>_stderr` and `<task>/n_samples` of every succeeded task, and
    `<task>/judge_errors`, `<task>/judge_judgments` of every task whose harness counted them; a task
    sampled k times also gets `<task>/<mode>/<metric>` (and `_stderr`, `_std_dev`) for each evaluation mode
    (its `<task>/<metric>` is the first mode's, pass@1[avg-of-k])."""
    out: dict[str, float] = {}
    for task, outcome in results.tasks.items():
        # a judged task's judge errors, failed or not: a task the judge failed says why beside its status
        out.update({f"{task}/{key}": value for key, value in judge_error_values(outcome).items()})
        if outcome.status != "succeeded":
            continue
        for name, metric in outcome.metrics.items():
            if _finite(metric.value):
                out[f"{task}/{name}"] = float(metric.value)
            if metric.stderr is not None and _finite(metric.stderr):
                out[f"{task}/{name}_stderr"] = float(metric.stderr)
        if outcome.n_samples is not None:
            out[f"{task}/n_samples"] = float(outcome.n_samples)
        if outcome.modes:  # repeated sampling: every evaluation mode, keyed as in results.json
            out.update({f"{task}/{key}": value for key, value in flat_metrics(outcome).items() if "/" in key})
    return out


def usage_values(results: InvocationResults) -> dict[str, float]:
    """What the invocation cost (`results.usage`), under `usage/`: gpu_hours, wall_seconds, gpus, the seconds of
    each phase (startup, tasks, idle) and, on the CPU, cpu_seconds; empty when it was not measured."""
    usage = results.usage or {}
    out = {
        f"usage/{k}": float(usage[k])
        for k in ("gpu_hours", "wall_seconds", "gpus", "cpu_seconds")
        if _finite(usage.get(k))
    }
    out.update({f"usage/{k}_seconds": float(v) for k, v in (usage.get("phases") or {}).items() if _finite(v)})
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_config(content: ExportContent) -> dict[str, Any]:
    """The config a run records: the compiled config plus what this invocation was and how it went."""
    results = content.results
    return {
        **content.config,
        "ckpteval": {
            "invocation": content.invocation,
            "status": results.status,
            "model": results.model,
            "label": results.label,
            "created": results.created,
            "tasks": {name: outcome.status for name, outcome in results.tasks.items()},
            "job_dir": str(content.job_dir) if content.job_dir else None,
            # what produced the numbers (results.json's `provenance`)
            "provenance": dataclasses.asdict(results.provenance) if results.provenance else None,
        },
    }


def artifact_files(job_dir: Path) -> dict[str, Path]:
    """The files of `job_dir` worth keeping with the results (see the module doc), by relative name."""
    out: dict[str, Path] = {}
    for name in (RESULTS_FILE, CONFIG_FILE, PROVENANCE_FILE):
        if (job_dir / name).is_file():
            out[name] = job_dir / name
    tasks = job_dir / TASKS_DIR
    if not tasks.is_dir():
        return out
    for task_dir in sorted(p for p in tasks.iterdir() if p.is_dir()):
        for name in ("run_config.yml", SAMPLES_FILE):
            if (task_dir / name).is_file():
                out[f"{TASKS_DIR}/{task_dir.name}/{name}"] = task_dir / name
        output = task_dir / "output"
        if output.is_dir():
            for path in sorted(output.rglob("*")):
                rel = path.relative_to(output)
                if path.is_file() and not path.is_symlink() and _kept(rel, path):
                    out[f"{TASKS_DIR}/{task_dir.name}/output/{rel.as_posix()}"] = path
    return out


def _kept(rel: Path, path: Path) -> bool:
    if any(part.startswith(".") or "cache" in part.lower() for part in rel.parts):
        return False
    if path.name.lower().endswith(_EXCLUDED_SUFFIXES):
        return False
    return path.stat().st_size <= _MAX_FILE_BYTES


@dataclass(frozen=True)
class SampleTable:
    """One task's per-sample scores as a table: sample, task, doc, repeat, then one column per metric."""

    columns: list[str]
    rows: list[list[Any]]


def sample_tables(content: ExportContent) -> dict[str, SampleTable]:
    """Task -> its per-sample table, for every succeeded task with a samples.jsonl in the job dir."""
    from ckpteval.results.samples import metric_names, read_samples

    if content.job_dir is None:
        return {}
    out = {}
    for task, outcome in content.results.tasks.items():
        path = content.job_dir / content.task_dirs.get(task, f"{TASKS_DIR}/{task}") / SAMPLES_FILE
        if outcome.status != "succeeded" or not path.is_file():
            continue
        samples = read_samples(path)
        metrics = metric_names(samples)
        out[task] = SampleTable(
            columns=["sample", "task", "doc", "repeat", *metrics],
            rows=[[s.sample, s.task, s.doc, s.repeat, *(s.scores.get(m) for m in metrics)] for s in samples],
        )
    return out


def read_saved_config(path: Path) -> dict[str, Any]:
    """The compiled config a job directory (or an invocation record) saved, as plain data."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExportError(f"{path} does not exist: the invocation's config was not saved.") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ExportError(f"Cannot read the invocation's config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ExportError(f"{path} does not hold a config mapping.")
    return data


def load_content(
    job_dir: Path,
    results: InvocationResults,
    *,
    config_file: Path | None = None,
    task_dirs: dict[str, str] | None = None,
) -> ExportContent:
    """The content of an invocation whose files are in `job_dir`; the config comes from `config_file`
    (default `<job_dir>/config.yaml`). `results` are exported as given, whatever results.json says."""
    config_path = config_file or job_dir / CONFIG_FILE
    config = read_saved_config(config_path)
    files = artifact_files(job_dir) if job_dir.is_dir() else {}
    files.setdefault(CONFIG_FILE, config_path)
    return ExportContent(
        invocation=results.invocation,
        results=results,
        config=config,
        files=files,
        task_dirs=dict(task_dirs or {}),
        job_dir=job_dir,
    )
