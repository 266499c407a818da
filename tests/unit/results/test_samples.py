"""Collecting a task writes its normalized per-sample scores and takes the stderr lm-eval did not give from them."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from ckpteval.errors import EvaluationError
from ckpteval.results.collect import task_outcome
from ckpteval.results.samples import SAMPLES_FILE, read_samples

DATE = "2026-11-24T10-00-00.000000"
SUBJECTS = {"mmlu_str_anatomy": [1, 0, 1], "mmlu_str_virology": [0, 0, 1, 1]}  # exact_match per document


def _lm_eval_output(output: Path, subjects: dict[str, list[int]], *, stderr: object = "N/A") -> None:
    """What nemo-evaluator + lm-eval leave for `mmlu_str` (a group of subjects), as in a real run:
    results.yml, results_<date>.json (the group's stderr "N/A", as for generation tasks) and one
    samples file per subject with lm-eval's own doc_hash."""
    run = output / "megatron-model"
    run.mkdir(parents=True)
    (output / "results.yml").write_text("config:\n  type: adlr_mmlu\n  params:\n    task: mmlu_str\n")
    flat = [s for scores in subjects.values() for s in scores]
    results = {
        "results": {"mmlu_str": {"exact_match,none": sum(flat) / len(flat), "exact_match_stderr,none": stderr}},
        "groups": {"mmlu_str": {"exact_match,none": sum(flat) / len(flat), "exact_match_stderr,none": stderr}},
        "group_subtasks": {"mmlu_str": list(subjects)},
        "configs": {s: {"metric_list": [{"metric": "exact_match", "aggregation": "mean"}]} for s in subjects},
        "n-samples": {s: {"original": 100, "effective": len(v)} for s, v in subjects.items()},
    }
    (run / f"results_{DATE}.json").write_text(json.dumps(results))
    for subject, scores in subjects.items():
        lines = []
        for i, score in enumerate(scores):
            doc = {"question": f"{subject} question {i}", "answer": "A"}
            doc_hash = hashlib.sha256(json.dumps(doc, indent=2).encode()).hexdigest()
            lines.append(
                {
                    "doc_id": i,
                    "doc": doc,
                    "target": "A",
                    "arguments": {
                        "gen_args_0": {"arg_0": f"{subject} question {i}\nAnswer:", "arg_1": {"until": ["\n"]}}
                    },
                    "resps": [[" A" if score else " B"]],
                    "filter": "none",
                    "filtered_resps": ["A" if score else "B"],
                    "metrics": ["exact_match"],
                    "doc_hash": doc_hash,
                    "exact_match": float(score),
                }
            )
        (run / f"samples_{subject}_{DATE}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def _finished(task_dir: Path) -> None:
    (task_dir / ".done").write_text("")
    (task_dir / "state").write_text("succeeded\n")


def test_collect_writes_samples_and_fills_the_missing_stderr(tmp_path: Path):
    task_dir = tmp_path / "tasks" / "adlr_mmlu"
    _lm_eval_output(task_dir / "output", SUBJECTS)
    _finished(task_dir)
    outcome = task_outcome(task_dir, "adlr_mmlu")
    assert outcome.status == "succeeded", outcome.error
    metric = outcome.metrics["exact_match"]
    # 7 documents, 4 right: sample sd of 4 ones and 3 zeros over sqrt(7)
    mean = 4 / 7
    sd = math.sqrt((4 * (1 - mean) ** 2 + 3 * mean**2) / 6)
    assert metric.value == pytest.approx(mean)
    assert metric.stderr == pytest.approx(sd / math.sqrt(7))
    assert metric.n_samples == 7
    rows = read_samples(task_dir / SAMPLES_FILE)
    assert [r.sample for r in rows] == [f"{s}/{i}" for s, v in SUBJECTS.items() for i in range(len(v))]
    assert [r.scores for r in rows] == [{"exact_match": float(x)} for v in SUBJECTS.values() for x in v]
    first = json.loads((task_dir / SAMPLES_FILE).read_text().splitlines()[0])
    doc = {"question": "mmlu_str_anatomy question 0", "answer": "A"}
    assert first == {
        "sample": "mmlu_str_anatomy/0",
        "task": "mmlu_str_anatomy",
        "doc": hashlib.sha256(json.dumps(doc, indent=2).encode()).hexdigest(),
        "repeat": None,
        "scores": {"exact_match": 1.0},
        "prompt": "mmlu_str_anatomy question 0\nAnswer:",
        "response": " A",
        "answer": "A",
        "target": "A",
    }


def test_a_stderr_the_harness_gave_is_kept(tmp_path: Path):
    task_dir = tmp_path / "t"
    _lm_eval_output(task_dir / "output", SUBJECTS, stderr=0.123)
    _finished(task_dir)
    assert task_outcome(task_dir, "adlr_mmlu").metrics["exact_match"].stderr == 0.123


def test_repeated_task_keeps_every_repeat(tmp_path: Path):
    task_dir = tmp_path / "t"
    (task_dir).mkdir()
    (task_dir / "repeats").write_text("2\n")
    _lm_eval_output(task_dir / "output-rs0", SUBJECTS)
    _lm_eval_output(task_dir / "output-rs1", {s: [1 - x for x in v] for s, v in SUBJECTS.items()})
    for i in (0, 1):
        (task_dir / f"output-rs{i}" / ".done").write_text("")
    _finished(task_dir)
    outcome = task_outcome(task_dir, "adlr_mmlu")
    assert outcome.status == "succeeded", outcome.error
    rows = read_samples(task_dir / SAMPLES_FILE)
    assert [r.repeat for r in rows] == [0] * 7 + [1] * 7
    assert rows[0].doc == rows[7].doc and rows[0].scores != rows[7].scores
    for mode, metrics in outcome.modes.items():
        assert metrics["exact_match"].stderr is not None, mode


def test_a_task_without_per_sample_output_has_no_samples_file(tmp_path: Path):
    task_dir = tmp_path / "t"
    _lm_eval_output(task_dir / "output", SUBJECTS)
    for path in (task_dir / "output").rglob("samples_*.jsonl"):
        path.unlink()
    _finished(task_dir)
    outcome = task_outcome(task_dir, "adlr_mmlu")
    assert outcome.status == "succeeded"
    assert outcome.metrics["exact_match"].stderr is None
    assert not (task_dir / SAMPLES_FILE).exists()


def test_a_broken_samples_file_is_named(tmp_path: Path):
    path = tmp_path / SAMPLES_FILE
    path.write_text('{"sample": "x/0", "task": "x", "doc": "d", "scores": {"acc": 1}}\nnot json\n')
    with pytest.raises(EvaluationError, match=r"samples.jsonl:2 is not a ckpteval sample record"):
        read_samples(path)


def test_an_older_job_without_samples_file_is_paired_from_the_harness_output(tmp_path: Path):
    from ckpteval.results.compare import InvocationSamples
    from ckpteval.results.model import InvocationResults, TaskOutcome

    task_dir = tmp_path / "tasks" / "adlr_mmlu"
    _lm_eval_output(task_dir / "output", SUBJECTS)
    outcome = TaskOutcome(name="adlr_mmlu", status="succeeded", harness="mmlu_str")
    results = InvocationResults(invocation="0ld0ld00", created="", status="succeeded", tasks={"adlr_mmlu": outcome})
    loaded = InvocationSamples.load(tmp_path, results, {"adlr_mmlu": "tasks/adlr_mmlu"})
    assert [r.sample for r in loaded.samples["adlr_mmlu"]][:2] == ["mmlu_str_anatomy/0", "mmlu_str_anatomy/1"]
    assert not (task_dir / SAMPLES_FILE).exists()  # reading never writes
