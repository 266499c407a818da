"""What nemo-evaluator + lm-eval leave in a task's output directory, in the format of a real run (results.yml,
`results_<date>.json`, `samples_<task>_<date>.jsonl` with lm-eval's own fields), for each kind of task we ship:
multiple choice scored by log-likelihood (hellaswag), generation with two answer filters (gsm8k), and repeated
sampling. HumanEval (code) is a recorded run: tests/unit/results/golden/humaneval_run."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckpteval.results.model import InvocationResults

DATE = "2026-11-27T10-00-00.000000"
HUMANEVAL_RUN = Path(__file__).parents[1] / "unit" / "results" / "golden" / "humaneval_run"


def _hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, indent=2, ensure_ascii=False).encode()).hexdigest()


def _write(
    output: Path, *, task: str, harness_task: str, records: list[dict[str, Any]], config: dict[str, Any]
) -> None:
    run = output / "megatron-model"
    run.mkdir(parents=True)
    (output / "results.yml").write_text(f"config:\n  type: {task}\n  params:\n    task: {harness_task}\n")
    metrics: dict[str, list[float]] = {}
    for r in records:
        for m in r["metrics"]:
            metrics.setdefault(f"{m},{r['filter']}", []).append(float(r[m]))
    values: dict[str, Any] = {"alias": harness_task}
    for key, scores in metrics.items():
        name, filt = key.split(",", 1)
        values[key] = sum(scores) / len(scores)
        values[f"{name}_stderr,{filt}"] = "N/A"
    n = len({r["doc_id"] for r in records})
    results = {
        "results": {harness_task: values},
        "group_subtasks": {harness_task: []},
        "configs": {harness_task: config},
        "n-samples": {harness_task: {"original": n, "effective": n}},
    }
    (run / f"results_{DATE}.json").write_text(json.dumps(results))
    (run / f"samples_{harness_task}_{DATE}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def finish(task_dir: Path) -> None:
    """Mark the task finished, as the job script does."""
    (task_dir / ".done").write_text("")
    (task_dir / "state").write_text("succeeded\n")


def hellaswag_run(task_dir: Path, right: Sequence[bool]) -> None:
    """hellaswag (4 endings, log-likelihood): document i's highest-scoring ending is the gold one where right[i]."""
    records = []
    for i, ok in enumerate(right):
        endings = [f" ending {j} of context {i}." for j in range(4)]
        doc = {"query": f"Context {i}: a person", "choices": endings, "gold": i % 4}
        chosen = i % 4 if ok else (i + 1) % 4
        lls = [-10.0 - j for j in range(4)]
        lls[chosen], lls[0] = lls[0], lls[chosen]
        args = {f"gen_args_{j}": {"arg_0": doc["query"], "arg_1": e} for j, e in enumerate(endings)}
        records.append(
            {
                "doc_id": i,
                "doc": doc,
                "target": i % 4,
                "arguments": args,
                # as lm-eval 0.4 logs them: the log-likelihood and is-greedy of each ending as strings
                "resps": [[[str(ll), "False"]] for ll in lls],
                "filtered_resps": [[str(ll), "False"] for ll in lls],
                "filter": "none",
                "metrics": ["acc", "acc_norm"],
                "doc_hash": _hash(doc),
                "prompt_hash": _hash(doc["query"]),
                "target_hash": _hash(i % 4),
                "acc": 1.0 if ok else 0.0,
                "acc_norm": 1.0 if ok else 0.0,
            }
        )
    config = {"metric_list": [{"metric": "acc", "aggregation": "mean"}, {"metric": "acc_norm", "aggregation": "mean"}]}
    _write(task_dir / "output", task="hellaswag", harness_task="hellaswag", records=records, config=config)


def mmlu_str_run(task_dir: Path, right: Sequence[bool], *, harness_task: str = "mmlu_str_anatomy") -> None:
    """adlr_mmlu's lm-eval task (mmlu_str: a generated letter among the document's 4 choices, exact_match):
    document i answered right where right[i]."""
    records = []
    for i, ok in enumerate(right):
        doc = {"question": f"Question {i}?", "subject": "anatomy", "choices": ["w", "x", "y", "z"], "answer": i % 4}
        gold = "ABCD"[i % 4]
        said = gold if ok else "ABCD"[(i + 1) % 4]
        prompt = f"{doc['question']}\nA. w\nB. x\nC. y\nD. z\nAnswer:"
        records.append(
            {
                "doc_id": i,
                "doc": doc,
                "target": gold,
                "arguments": {"gen_args_0": {"arg_0": prompt, "arg_1": {"max_gen_toks": 2}}},
                "resps": [[f" {said}"]],
                "filtered_resps": [said],
                "filter": "none",
                "metrics": ["exact_match"],
                "doc_hash": _hash(doc),
                "prompt_hash": _hash(prompt),
                "target_hash": _hash(gold),
                "exact_match": 1.0 if ok else 0.0,
            }
        )
    config = {"metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}]}
    _write(task_dir / "output", task="adlr_mmlu", harness_task=harness_task, records=records, config=config)


def gsm8k_run(output: Path, right: Sequence[bool], *, task: str = "gsm8k", harness_task: str = "gsm8k") -> None:
    """gsm8k (generation, strict-match and flexible-extract filters): document i answered right where right[i]
    (`harness_task`: the leaf task's name, the first part of each document's id)."""
    records = []
    for i, ok in enumerate(right):
        doc = {"question": f"Question {i}: how many apples?", "answer": f"Some reasoning.\n#### {i + 2}"}
        said = f"They have {i + 2 if ok else i + 3} apples. #### {i + 2 if ok else i + 3}"
        for filt, extracted in (("strict-match", [f"{i + 2 if ok else i + 3}"]), ("flexible-extract", [str(i + 2)])):
            records.append(
                {
                    "doc_id": i,
                    "doc": doc,
                    "target": doc["answer"],
                    "arguments": {"gen_args_0": {"arg_0": f"Question: {doc['question']}\nAnswer:", "arg_1": {}}},
                    "resps": [[said]],
                    "filtered_resps": extracted,
                    "filter": filt,
                    "metrics": ["exact_match"],
                    "doc_hash": _hash(doc),
                    "prompt_hash": _hash(doc["question"]),
                    "target_hash": _hash(doc["answer"]),
                    "exact_match": (1.0 if ok else 0.0) if filt == "strict-match" else 1.0,
                }
            )
    config = {"metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}]}
    _write(output, task=task, harness_task=harness_task, records=records, config=config)


def repeated_gsm8k_run(task_dir: Path, rights: Sequence[Sequence[bool]]) -> None:
    """gsm8k sampled len(rights) times (`output-rs<i>`, as `evaluation.repeats` lays it out)."""
    task_dir.mkdir(parents=True)
    (task_dir / "repeats").write_text(f"{len(rights)}\n")
    for i, right in enumerate(rights):
        gsm8k_run(task_dir / f"output-rs{i}", right)
        (task_dir / f"output-rs{i}" / ".done").write_text("")


def humaneval_run(task_dir: Path, passed: dict[int, bool] | None = None) -> None:
    """The recorded HumanEval run (4 problems: 0 and 2 pass); `passed` overrides a problem's pass_at_1 as a
    candidate model would."""
    shutil.copytree(HUMANEVAL_RUN, task_dir)
    if passed:
        samples = next((task_dir / "output").rglob("samples_*.jsonl"))
        lines = [json.loads(line) for line in samples.read_text().splitlines()]
        for line in lines:
            if int(line["doc_id"]) in passed:
                line["pass_at_1"] = 1.0 if passed[int(line["doc_id"])] else 0.0
        samples.write_text("".join(json.dumps(line) + "\n" for line in lines))


def record_run(root: Path, invocation: str, tasks: dict[str, Callable[[Path], None]]) -> InvocationResults:
    """A finished local invocation under `root/<invocation>` whose tasks' harness output is written by `tasks`
    (task -> writer of its task dir), collected as the job collects it (results.json, samples.jsonl)."""
    from ckpteval.invocation.record import InvocationRecord, TaskEntry
    from ckpteval.results.collect import collect_results
    from ckpteval.results.store import write_results

    job_dir = root / invocation
    for task, write in tasks.items():
        write(job_dir / "tasks" / task)
        finish(job_dir / "tasks" / task)
    results = collect_results(
        job_dir, [(t, f"tasks/{t}") for t in tasks], invocation=invocation, created="2026-11-27T10:00:00Z", model=None
    )
    write_results(job_dir, results)
    InvocationRecord(
        id=invocation,
        created=results.created,
        mode="local",
        profile="local",
        executor="local",
        job_dir=str(job_dir),
        tasks=[TaskEntry(name=t, dir=f"tasks/{t}") for t in tasks],
        local_results_dir=str(job_dir),
    ).save()
    return results
