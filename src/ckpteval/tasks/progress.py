"""How far a running task is, for the CLI's progress bar (polled about twice a second): in documents, the
unit its results count (`n`), with the requests sent for them as detail.

Documents come from `<output_dir>/progress_docs` ("DONE TOTAL", written by our harness hook for lm-eval
tasks, `ckpteval_documents`): a document is done when every request it sends is answered (a
multiple-choice document sends one per choice, in lm-eval's order, not one document after another), and
the total is what lm-eval hands the model, so both are exact. Until lm-eval hands over its requests, and
for harnesses other than lm-eval, nothing says how many documents are done: `docs` is None (not guessed
from the requests), and only requests are shown.

Requests come from `<output_dir>/progress` (written by the harness hook for lm-eval tasks,
`ckpteval_responses`, and by nemo-evaluator's progress_tracking interceptor for other harnesses): the
number of requests the endpoint answered successfully (cache replays and failed attempts are not
counted; a resumed run starts from the count the previous run left). Their `total` is computed like the
documents' (HellaSwag sends 4 per document); None while it cannot be known yet (before the harness loaded
its data) and for tasks this module has no sizes for.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import functools
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.tasks.harness_hook import ckpteval_documents as documents
from ckpteval.tasks.harness_hook import ckpteval_offline_data as offline_data
from ckpteval.tasks.harness_hook import ckpteval_responses as responses

PROGRESS_FILE = responses.PROGRESS_FILE  # the hook writes it (the proxy's progress_tracking, same name)
DOCS_FILE = documents.DOCS_FILE

# lm-eval task -> requests per evaluated document
_REQUESTS_PER_DOC = {"mmlu_str": 1, "hellaswag": 4, "gsm8k": 1, "adlr_humaneval_greedy": 1}
# documents in the evaluated split on the hub (MMLU's per-subject sizes come from the packaged test set,
# which is the complete hub test split)
_HUB_DOCS = {"hellaswag": 10042, "gsm8k": 1319, "adlr_humaneval_greedy": 164}


@dataclass(frozen=True)
class Progress:
    """Requests answered so far and, when known, how many the task sends in all; documents done and in all,
    where the harness says (None: it does not)."""

    done: int
    total: int | None
    docs: int | None = None
    docs_total: int | None = None


@functools.cache
def _mmlu_hub_subject_sizes() -> dict[str, int]:
    test_and_dev = offline_data._mmlu_by_subject()
    return {s: len(test) + len(dev) for s, (test, dev) in test_and_dev.items()}


def _doc_counts(harness_task: str, *, offline: bool) -> list[int] | None:
    """Documents per (sub)task the harness evaluates, before `limit`."""
    if harness_task == "mmlu_str":
        if offline:
            return [len(test) for test, _ in offline_data._mmlu_by_subject().values()]
        return list(_mmlu_hub_subject_sizes().values())
    key = offline_data.LM_EVAL_TASK_SOURCES.get(harness_task)
    if key is None:
        return None
    if offline:
        return [offline_data.available_rows(key)]
    return [_HUB_DOCS[harness_task]] if harness_task in _HUB_DOCS else None


def expected_documents(params: dict[str, Any], *, offline: bool) -> int | None:
    """Documents the harness evaluates for a task with these `config.params` (None when unknown)."""
    counts = documents_per_subtask(params, offline=offline)
    return None if counts is None else sum(counts)


def documents_per_subtask(params: dict[str, Any], *, offline: bool) -> list[int] | None:
    """Documents the harness evaluates per (sub)task (MMLU: per subject) with these `config.params`, its
    `limit_samples` applied to each as lm-eval applies it (None when unknown)."""
    harness_task = str(params.get("task") or "")
    extra = params.get("extra") or {}
    if harness_task not in _REQUESTS_PER_DOC or extra.get("downsampling_ratio") is not None:
        return None
    counts = _doc_counts(harness_task, offline=offline)
    if counts is None:
        return None
    limit = params.get("limit_samples")
    if limit is not None:
        limit = float(limit)
        counts = [min(n, math.ceil(n * limit)) if limit < 1.0 else min(n, int(limit)) for n in counts]
    return counts


def expected_requests(params: dict[str, Any], *, offline: bool) -> int | None:
    """Requests the harness sends for a task with these `config.params` (None when unknown)."""
    docs = expected_documents(params, offline=offline)
    return None if docs is None else _REQUESTS_PER_DOC[str(params.get("task"))] * docs


@functools.lru_cache(maxsize=64)
def _total_for(output_dir: str, offline: bool, config_mtime: float) -> int | None:
    """The requests the task in `output_dir` sends, from its run config."""
    import yaml

    try:
        rendered = yaml.safe_load((Path(output_dir) / "run_config.yml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return None
    params = (rendered.get("config") or {}).get("params") or {}
    return expected_requests(params, offline=offline)


def _served_offline(output_dir: Path) -> bool | None:
    """True/False once the harness has loaded its data (False: from the hub), None before."""
    report = output_dir / offline_data.REPORT_FILE
    if report.is_file():
        try:
            records = json.loads(report.read_text(encoding="utf-8")).get("datasets", [])
        except (OSError, ValueError):
            return None
        served = Counter(r.get("served_from") for r in records if isinstance(r, dict))
        return served["package"] > 0
    # requests only start once the data is loaded: if some were answered, no packaged data was used
    return False if (output_dir / PROGRESS_FILE).is_file() else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def read_progress(task_output_dir: str | Path) -> Progress:
    """The task's progress now; cheap enough to call every 0.5 s (the totals are computed once)."""
    out = Path(task_output_dir)
    try:
        done = int((out / PROGRESS_FILE).read_text(encoding="utf-8").strip() or 0)
    except (OSError, ValueError):
        done = 0
    offline = _served_offline(out)
    total = None
    config = out / "run_config.yml"
    if offline is not None and config.is_file():
        total = _total_for(str(out), offline, config.stat().st_mtime)
    return _progress(done, total, _read(out / DOCS_FILE))


def _progress(done: int, total: int | None, docs_text: str | None) -> Progress:
    """Requests, from the count read and the total computed, and documents, as the hook counted them (None
    until it has: before lm-eval hands over its requests, or a harness it does not count for)."""
    if total is not None:
        done = min(done, total)  # a request answered after the client timed out is counted twice
    parts = (docs_text or "").split()
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return Progress(done=done, total=total, docs=int(parts[0]), docs_total=int(parts[1]))
    return Progress(done=done, total=total)


def progress_from_texts(
    progress: str | None, offline_report: str | None, run_config: str | None, docs: str | None = None
) -> Progress:
    """`read_progress` from file contents (a job followed over SSH has texts, not paths)."""
    import yaml

    try:
        done = int((progress or "").strip() or 0)
    except ValueError:
        done = 0
    offline: bool | None
    if offline_report is not None:
        try:
            records = json.loads(offline_report).get("datasets", [])
        except ValueError:
            records = []
        offline = any(isinstance(r, dict) and r.get("served_from") == "package" for r in records)
    else:
        offline = False if progress is not None else None
    total = None
    if offline is not None and run_config:
        try:
            params = ((yaml.safe_load(run_config) or {}).get("config") or {}).get("params") or {}
        except yaml.YAMLError:
            params = {}
        total = expected_requests(params, offline=offline)
    return _progress(done, total, docs)


def progress_reader(view: Any, task_dir: str) -> Progress:
    """The progress of the task in `task_dir` of a job, read through a `JobView` (local or remote).

    A task with k repeats counts the requests and documents of all k runs: done is their sum, total k times
    one run's (a document evaluated k times counts k times).
    """
    from ckpteval.tasks.repeats import REPEATS_FILE, read_repeats, run_layouts

    repeats = read_repeats(view.read_text(f"{task_dir}/{REPEATS_FILE}"))
    runs = []
    for layout in run_layouts(repeats):
        out = f"{task_dir}/{layout.output}"
        p = progress_from_texts(
            view.read_text(f"{out}/{PROGRESS_FILE}"),
            view.read_text(f"{out}/{offline_data.REPORT_FILE}"),
            view.read_text(f"{out}/run_config.yml"),
            view.read_text(f"{out}/{DOCS_FILE}"),
        )
        runs.append(p)
        if p.done == 0 and not p.docs and layout.repeat:
            break  # later repeats have not started either
    first, k = runs[0], max(1, repeats)
    counted = [p.docs for p in runs if p.docs is not None]
    return Progress(
        done=sum(p.done for p in runs),
        total=None if first.total is None else first.total * k,
        docs=sum(counted) if counted else None,
        docs_total=None if first.docs_total is None else first.docs_total * k,
    )
