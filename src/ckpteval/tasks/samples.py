"""Per-sample scores of one lm-eval run, from the `samples_<task>_<date>.jsonl` files `--log_samples` writes.

lm-eval writes one line per (document, filter): `doc_id`, `filter`, `filtered_resps` (the answer the
filter extracted from the response, e.g. "18" or "[invalid]"), `metrics` (the names of the per-sample
metrics) and each metric's value for that sample. Repeated sampling scores every run from these lines
(see `ckpteval.tasks.passk`), under the same metric names as the run's results (`exact_match,strict-match`
-> `exact_match__strict-match`).

A rerun of a task writes new files beside the old ones (lm-eval appends a date to each name); the
files that belong to the newest `results_<date>.json` are the ones read.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.errors import EvaluationError
from ckpteval.tasks.passk import NO_ANSWER, Sample
from ckpteval.tasks.results import leaf_tasks, metric_name

# metric name -> problem -> sample; a problem is (lm-eval task, doc_id) so group tasks' subtasks stay apart
RunSamples = dict[str, dict[Hashable, Sample]]


def _single(value: Any) -> Any:
    """A one-request, one-response value unwrapped (HumanEval's filter logs `[["code"]]`)."""
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value


def _answer(filtered_resps: Any) -> str | None:
    """The extracted answer of a sample: the filter's output for its one request, None when there is none."""
    value = _single(filtered_resps)
    if not isinstance(value, str):
        value = json.dumps(value, sort_keys=True, ensure_ascii=False)
    value = value.strip()
    return None if value in NO_ANSWER else value


def _score(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


# a metric given as a function (`metric: !function utils.pass_at_1`, HumanEval's) is saved in results.json as
# its source code (or its repr where lm-eval could not read the source); its samples carry the function's name
_FUNCTION_NAME = re.compile(r"^\s*(?:@.*\n\s*)*def\s+(\w+)\s*\(|^<function (\w+)[ >]")


def _config_metric_name(value: Any) -> str:
    """The name a task config's metric is logged under in the samples (a function metric: its name)."""
    text = str(value)
    found = _FUNCTION_NAME.search(text)
    return next(g for g in found.groups() if g) if found else text


def _averaged_metrics(task_config: dict[str, Any]) -> set[str] | None:
    """The metrics lm-eval aggregates by a plain mean over samples (None: the config does not say)."""
    metric_list = task_config.get("metric_list")
    if not isinstance(metric_list, list):
        return None
    return {
        _config_metric_name(m.get("metric"))
        for m in metric_list
        if isinstance(m, dict) and m.get("aggregation", "mean") == "mean"
    }


def _newest_run(output_dir: Path) -> tuple[Path, dict[str, Any]]:
    files = [p for p in output_dir.rglob("results_*.json") if p.is_file()]
    if not files:
        raise EvaluationError(f"No lm-eval results_*.json in {output_dir}: the run did not finish.")
    newest = max(files, key=lambda p: p.stat().st_mtime)
    return newest, dict(json.loads(newest.read_text(encoding="utf-8")))


@dataclass(frozen=True)
class SampleLine:
    """One line of an lm-eval samples file: one document under one filter, with its per-sample scores.

    `doc_hash` identifies the document across runs and invocations: lm-eval's own `doc_hash` (a SHA-256 of
    the document as JSON), or, when a harness wrote none, a SHA-256 of the document (or prompt) computed here.
    """

    task: str  # the lm-eval (leaf) task
    doc_id: int | str
    doc_hash: str
    filter: str
    answer: str | None
    scores: dict[str, float]  # clean metric name (`exact_match__strict-match`) -> score
    text: SampleText | None = None
    choices: int | None = None  # the answers a guess picks among (`choice_count`); None: not a choice task


@dataclass(frozen=True)
class SampleText:
    """What a reader of one sample wants to see: the prompt, what the model answered, and the target.

    A generation task's `response` is the model's raw output; a multiple-choice (log-likelihood) task's is the
    choice it scored highest, and its target the right choice's text.
    """

    prompt: str | None
    response: str | None
    target: str | None
    multiple_choice: bool = False


def _requests(arguments: Any) -> list[list[Any]]:
    """Each request's arguments: lm-eval logs `{"gen_args_0": {"arg_0": context, "arg_1": ...}, ...}` (a list of
    tuples in older versions)."""
    if isinstance(arguments, dict):
        return [list(a.values()) if isinstance(a, dict) else [a] for a in arguments.values()]
    if isinstance(arguments, list):
        return [list(a) if isinstance(a, (list, tuple)) else [a] for a in arguments]
    return []


def _log_likelihoods(filtered_resps: Any, n_requests: int) -> list[float] | None:
    """A multiple-choice sample's log-likelihood of each choice (`[[ll, is_greedy], ...]`; lm-eval 0.4 logs both
    as strings, `[["-59.19", "False"], ...]`), None otherwise."""
    if not isinstance(filtered_resps, list) or n_requests < 2 or len(filtered_resps) != n_requests:
        return None
    out = []
    for resp in filtered_resps:
        value = resp[0] if isinstance(resp, (list, tuple)) and resp else resp
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        out.append(float(value))
    return out


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def sample_text(record: dict[str, Any]) -> SampleText:
    """The prompt, the model's response and the target of one lm-eval sample record."""
    requests = _requests(record.get("arguments"))
    prompt = _as_text(requests[0][0]) if requests and requests[0] else None
    target = record.get("target")
    lls = _log_likelihoods(record.get("filtered_resps"), len(requests))
    if lls is not None:
        choices = [str(r[1]).strip() if len(r) > 1 else "" for r in requests]
        response: Any = choices[max(range(len(lls)), key=lls.__getitem__)]
        gold = int(target) if isinstance(target, int) or (isinstance(target, str) and target.isdigit()) else None
        if gold is not None and 0 <= gold < len(choices):
            target = choices[gold]
    else:
        response = _single(record.get("resps"))
    return SampleText(
        prompt=prompt, response=_as_text(response), target=_as_text(_single(target)), multiple_choice=lls is not None
    )


_LETTER = re.compile(r"^[A-Z]$")


def choice_count(record: dict[str, Any], text: SampleText) -> int | None:
    """How many answers a uniform guess picks among for this document: a multiple-choice (log-likelihood)
    sample's requests, one per choice; a generated answer that is one letter (MMLU's `C`) among the document's
    `choices` (`options`, MMLU-Pro's; ARC's `choices.text`). None where the task is not a choice among a few."""
    if text.multiple_choice:
        return len(_requests(record.get("arguments")))
    target = _single(record.get("target"))
    doc = record.get("doc")
    if not isinstance(target, str) or not _LETTER.match(target.strip()) or not isinstance(doc, dict):
        return None
    for key in ("choices", "options"):
        listed = doc.get(key)
        if isinstance(listed, dict):
            listed = listed.get("text")
        if isinstance(listed, list) and len(listed) > 1:
            return len(listed)
    return None


def _doc_hash(record: dict[str, Any]) -> str:
    given = record.get("doc_hash")
    if isinstance(given, str) and given:
        return given
    if "doc" in record:
        basis = json.dumps(record["doc"], sort_keys=True, ensure_ascii=False, default=str)
    elif record.get("prompt_hash"):
        return str(record["prompt_hash"])
    else:
        basis = json.dumps(record.get("arguments"), sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(basis.encode("utf-8")).hexdigest()


def read_sample_lines(output_dir: str | Path, harness_task: str) -> list[SampleLine]:
    """Every per-sample line of `harness_task` (a task or a group of tasks) in one run's output dir, with
    the scores of the metrics lm-eval averages over samples (corpus-level metrics have no per-sample score)."""
    out = Path(output_dir)
    results_path, results = _newest_run(out)
    date_id = results_path.stem.removeprefix("results_")
    leaves = leaf_tasks(harness_task, results.get("group_subtasks") or {})
    lines: list[SampleLine] = []
    for leaf in leaves:
        averaged = _averaged_metrics((results.get("configs") or {}).get(leaf) or {})
        path = results_path.parent / f"samples_{leaf}_{date_id}.jsonl"
        if not path.is_file():
            raise EvaluationError(
                f"{path.name} is missing in {results_path.parent}: per-sample scores need lm-eval's per-sample "
                "output (--log_samples).",
                hint="The task's command must keep --log_samples (the catalog's lm-eval tasks have it).",
            )
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    doc_id = record["doc_id"]
                    filt = str(record["filter"])
                    answer = _answer(record.get("filtered_resps"))
                    names = list(record.get("metrics") or [])
                    doc_hash = _doc_hash(record)
                    text = sample_text(record)
                    if text.multiple_choice:  # its answer is the choice it scored highest, not the log-likelihoods
                        answer = text.response
                    choices = choice_count(record, text)
                except (ValueError, KeyError, TypeError) as exc:
                    raise EvaluationError(f"{path}:{number} is not an lm-eval sample record ({exc}).") from None
                scores: dict[str, float] = {}
                for metric in names:
                    if averaged is not None and metric not in averaged:
                        continue  # a corpus-level metric (bleu, f1 over the set): not a per-sample score
                    score = _score(record.get(metric))
                    name = metric_name(f"{metric},{filt}")
                    if score is not None and name is not None:
                        scores[name] = score
                lines.append(SampleLine(leaf, doc_id, doc_hash, filt, answer, scores, text, choices))
    return lines


def read_run_samples(output_dir: str | Path, harness_task: str) -> RunSamples:
    """Every per-sample score of `harness_task` (a task or a group of tasks) in one run's output dir."""
    samples: RunSamples = {}
    for line in read_sample_lines(output_dir, harness_task):
        for name, score in line.scores.items():
            samples.setdefault(name, {})[(line.task, line.doc_id)] = Sample(line.answer, score)
    return samples
