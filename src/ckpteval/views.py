"""Plain data for presenting the library's values, shared by every front end (no rich, no Typer): the
score table's cells, a compiled config as YAML, a checkpoint description in words, a watched checkpoint's
verdicts in words; the names a shell completes (profiles, configs, tasks, invocations); where an
invocation's results file is and when its job finished.

Part of the public API (docs/architecture.md). Each name loads its module on first use.
"""

# The imports under TYPE_CHECKING are read by type checkers; `__all__` is made from `_WHERE`, so ruff does
# not see them used.
# ruff: noqa: F401
from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

# For type checkers only; at run time each name loads from `_WHERE` (tests/unit/test_public_api.py keeps
# the two the same). InvocationRecord is for this module's own signatures.
if TYPE_CHECKING:
    from ckpteval.checkpoint.description import summary as checkpoint_summary
    from ckpteval.config.compile import CompiledConfig
    from ckpteval.config.preview import config_yaml
    from ckpteval.invocation.record import InvocationRecord
    from ckpteval.job.request_groups import requests_in_words
    from ckpteval.results.answers import shorten
    from ckpteval.results.caveats import CAVEAT_MARK, caveat_notes, caveats
    from ckpteval.results.compare import REGRESSION_EXIT_CODE, UNTRUSTED_EXIT_CODE
    from ckpteval.results.model import JudgeErrors
    from ckpteval.results.table import FAILED_MARK, table_rows
    from ckpteval.watch.verdicts import verdict_lines

# The public names defined elsewhere, each with the module it loads from on first use.
_WHERE = {
    "config_yaml": "ckpteval.config.preview",
    "checkpoint_summary": "ckpteval.checkpoint.description:summary",
    "shorten": "ckpteval.results.answers",
    "REGRESSION_EXIT_CODE": "ckpteval.results.compare",
    "UNTRUSTED_EXIT_CODE": "ckpteval.results.compare",
    "FAILED_MARK": "ckpteval.results.table",
    "CAVEAT_MARK": "ckpteval.results.caveats",
    "caveats": "ckpteval.results.caveats",
    "caveat_notes": "ckpteval.results.caveats",
    "table_rows": "ckpteval.results.table",
    "requests_in_words": "ckpteval.job.request_groups",
    "verdict_lines": "ckpteval.watch.verdicts",
}

__all__ = sorted(
    [
        *_WHERE,
        "config_names",
        "export_destinations",
        "finished_at",
        "invocation_ids",
        "judge_errors",
        "no_tasks_hint",
        "note_seen_before",
        "planned_documents",
        "profile_names",
        "recorded_caveats",
        "results_file",
        "score_summary",
        "task_names",
    ]
)


def profile_names(env_file: str | Path | None = None) -> list[str]:
    """The env.toml profiles `--run`/`--batch` accept (the built-in `local` included). Raises ConfigError
    on a broken env.toml."""
    from ckpteval.config.profiles import load_env_file

    return load_env_file(Path(env_file) if env_file else None).profile_names


def config_names(env_file: str | Path | None = None) -> list[str]:
    """The config names `-c` accepts (packaged stage configs and the user's own)."""
    from ckpteval.config.compose import available_configs, config_search_path
    from ckpteval.config.profiles import load_env_file

    names = available_configs(config_search_path(load_env_file(Path(env_file) if env_file else None)))
    return [n for n in names if n != "default"]


def task_names() -> list[str]:
    """The task names `-t` accepts, bare (`hellaswag`; `harness.task` is accepted too)."""
    from ckpteval.tasks.catalog import load_catalog

    return [n for n in load_catalog().names() if "." not in n]


def no_tasks_hint(pattern: str | None = None, *, harness: str | None = None) -> str:
    """What to try when `ckpteval.tasks(pattern, harness=harness)` finds nothing (the harness meant, the
    names that match once case, '-' and '_' are set aside)."""
    from ckpteval.tasks.catalog import load_catalog

    return load_catalog().no_match_hint(pattern, harness=harness)


def export_destinations() -> list[str]:
    """The export destinations a config can enable and `evaluate export --to` names (the registered ones)."""
    from ckpteval.config.schema import EXPORT_SECTIONS

    return list(EXPORT_SECTIONS)


def invocation_ids() -> list[str]:
    """The recorded invocations' ids, newest first."""
    from ckpteval.invocation.record import list_records

    return [r.id for r in list_records()]


def results_file(record: InvocationRecord) -> Path | None:
    """Where this machine holds the invocation's results.json (None: nowhere yet)."""
    from ckpteval.invocation.jobdir import JobDir

    return Path(record.local_results_dir) / JobDir.RESULTS if record.local_results_dir else None


def note_seen_before(note: str) -> bool:
    """Whether this user was shown `note` (a score table's footnote) before; records it as shown. A long
    note the user has read is then said in a few words (the full text stays in results.json and
    `evaluate results`)."""
    import hashlib

    from ckpteval.invocation.record import state_dir

    path = state_dir() / "notes-seen"
    digest = hashlib.sha256(note.encode()).hexdigest()[:16]
    try:
        seen = set(path.read_text(encoding="utf-8").split())
    except OSError:
        seen = set()
    if digest in seen:
        return True
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(digest + "\n")
    except OSError:
        pass  # a read-only state dir: the note is shown in full every time
    return False


def planned_documents(compiled: CompiledConfig) -> dict[str, str]:
    """Per task of a compiled invocation whose document count ckpteval knows, how many documents it will
    evaluate, in words: `285 documents (5 per subject, 57 subjects)` where the limit applies per subtask."""
    from ckpteval.merge import deep_merge
    from ckpteval.tasks.offline_data import offline_source_key
    from ckpteval.tasks.progress import documents_per_subtask

    config = compiled.config
    out = {}
    for task in compiled.tasks:
        params = deep_merge(task.spec.params, (task.evaluator_config.get("config") or {}).get("params") or {})
        # on this machine a task with packaged data reads it (the hub is not asked here)
        offline = (
            not config.execution.on_cluster
            and offline_source_key(task.spec) is not None
            and config.evaluation.offline_data != "off"
        )
        counts = documents_per_subtask(params, offline=offline)
        if not counts:
            continue
        text = f"{sum(counts):,} document" + ("" if sum(counts) == 1 else "s")
        if len(counts) > 1:
            limit = params.get("limit_samples")
            each = f"{limit} per subtask, " if limit is not None and max(counts) == min(counts) else ""
            text += f" ({each}{len(counts)} subtasks)"
        out[task.name] = text
    return out


def score_summary(record: InvocationRecord) -> str:
    """An invocation's scores in a few words, from the results.json this machine holds ("" where it holds
    none): each task's first metric, the documents behind it and, for a choice task, what guessing scores:
    `adlr_mmlu 0.2456 n=57 (at chance: 0.25)`; a judged task's judge errors, `mtbench 7.0000 (judge errors 3
    of 80)`."""
    from ckpteval.errors import CkptevalError
    from ckpteval.results.store import read_results
    from ckpteval.results.table import chance_text

    path = results_file(record)
    if path is None or not path.is_file():
        return ""
    try:
        found = read_results(path)
    except (CkptevalError, OSError, ValueError):
        return ""
    parts = []
    for name, outcome in found.tasks.items():
        metric = next(iter(outcome.metrics.values()), None)
        if outcome.status != "succeeded" or metric is None:
            parts.append(f"{name} {outcome.status}")
        else:
            n = metric.n_samples if metric.n_samples is not None else outcome.n_samples
            chance = chance_text(next(iter(outcome.metrics)), metric, outcome.chance)
            parts.append(
                f"{name} {metric.value:.4f}" + (f" n={n}" if n is not None else "") + (f" ({chance})" if chance else "")
            )
        if outcome.judge_errors is not None:  # beside the score, or beside `failed` when they failed it
            parts[-1] += f" ({outcome.judge_errors.text()})"
    return ", ".join(parts)


def judge_errors(record: InvocationRecord) -> dict[str, JudgeErrors]:
    """Per judge-scored task whose harness counted them, its judge errors (`judge errors 3 of 80`), from the
    results.json this machine holds (nothing fetched: {} when there is none here yet)."""
    from ckpteval.errors import CkptevalError
    from ckpteval.results.store import read_results

    path = results_file(record)
    if path is None or not path.is_file():
        return {}
    try:
        found = read_results(path)
    except (CkptevalError, OSError, ValueError):
        return {}
    return {name: o.judge_errors for name, o in found.tasks.items() if o.judge_errors is not None}


def recorded_caveats(record: InvocationRecord) -> list[str]:
    """The caveats of an invocation's numbers (`ckpteval.results.caveats`), one line each, from the results.json
    this machine holds (nothing fetched: [] when there is none here yet)."""
    import json

    from ckpteval.results.caveats import caveats
    from ckpteval.results.model import InvocationResults

    path = results_file(record)
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, ValueError):
        return []
    return [c.line() for c in caveats(InvocationResults.from_json(data))] if isinstance(data, dict) else []


def recorded_usage(record: InvocationRecord) -> str | None:
    """What an invocation cost, in one line ("used 0.012 GPU-h (1 GPU × 43 s): start-up 20 s, ..."), from the
    results.json this machine holds (`ckpteval.results.usage`); None when there is none here, or no usage in it."""
    from ckpteval.results.model import InvocationResults
    from ckpteval.results.table import usage_note

    data = _recorded_results(record)
    if data is None or not isinstance(data.get("usage"), dict):
        return None
    return usage_note(InvocationResults.from_json(data))


def recorded_usage_json(record: InvocationRecord) -> dict[str, Any] | None:
    """The same as plain JSON values (results.json's `usage`: `ckpteval.results.usage.Usage.to_json`), for
    `status --json`; None when this machine holds no results.json with usage for it."""
    from ckpteval.results.usage import Usage

    data = _recorded_results(record)
    if data is None or not isinstance(data.get("usage"), dict):
        return None
    try:
        return Usage.from_json(data["usage"]).to_json()
    except TypeError:  # a results.json written by hand or by a version with other fields
        return None


def _recorded_results(record: InvocationRecord) -> dict[str, Any] | None:
    import json

    path = results_file(record)
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def finished_at(record: InvocationRecord) -> float | None:
    """When the invocation's job finished (a POSIX time), where this machine has its job directory or a
    fetched copy of it: the time the job recorded as it ended (`state/ended`); for a local job from before
    it wrote one, the time of its `finished` mark. None for a job that has not finished, or one on a
    cluster whose files were not fetched (a fetched copy's file times are the fetch's, not the job's)."""
    from datetime import datetime

    from ckpteval.config.executors import executor_names, find_executor
    from ckpteval.invocation.jobdir import JobDir

    here = record.executor in executor_names() and not find_executor(record.executor).on_cluster
    job_dir = Path(record.job_dir) if here else Path(record.local_results_dir) if record.local_results_dir else None
    if job_dir is None:
        return None
    try:
        return datetime.fromisoformat((job_dir / JobDir.ENDED).read_text().strip().replace("Z", "+00:00")).timestamp()
    except (OSError, ValueError):
        pass
    try:
        return (job_dir / JobDir.FINISHED).stat().st_mtime if here else None
    except OSError:
        return None


def __getattr__(name: str) -> Any:
    """A function or constant, imported from its module on first use."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'ckpteval.views' has no attribute {name!r}")
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute or name)
