"""A judge's failures never score silently: a judged task's judge errors (judgments with no rating after the
harness's retries), as the harness hook counts them into its output dir, reach results.json, the score
table (a row under the task's scores), `status`'s summary, W&B/MLflow's metrics and the eval delegate's,
for a task that scored and for one the judge failed past the threshold."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from ckpteval.delegate.protocol import flat_delegate_metrics, raw_metrics
from ckpteval.export.content import metric_values
from ckpteval.results.collect import collect_results
from ckpteval.results.model import InvocationResults
from ckpteval.results.store import read_results, write_results
from ckpteval.results.table import render_text
from ckpteval.tasks.harness_hook.ckpteval_judge import JUDGE_ERRORS_FILE, JudgeFailures, check_judgments


def _judgments(scores: list[int]) -> list[dict]:
    return [
        {"question_id": 81 + i // 2, "turn": 1 + i % 2, "score": s, "judgment": f"Rating: [[{s}]]" if s > 0 else "?"}
        for i, s in enumerate(scores)
    ]


def _scored_task(task_dir: Path, *, errors: int, judgments: int) -> None:
    """An MT-Bench task that finished: nemo-evaluator's results.yml and the hook's count of judge errors."""
    out = task_dir / "output"
    out.mkdir(parents=True)
    (out / "run_config.yml").write_text(yaml.dump({"framework_name": "mtbench", "config": {"type": "mtbench"}}))
    os.utime(out / "run_config.yml", (1_000_000_000, 1_000_000_000))
    score = {"scores": {"average_score": {"value": 7.0, "stats": {}}}}
    results = {"groups": {"mtbench:judge-x": {"metrics": {"average_score": score}}}, "tasks": {}}
    (out / "results.yml").write_text(yaml.dump({"config": {"type": "mtbench"}, "results": results}))
    (out / JUDGE_ERRORS_FILE).write_text(json.dumps({"errors": errors, "judgments": judgments, "max_error_rate": 0.5}))
    (task_dir / "state").write_text("succeeded\n")
    (task_dir / ".done").touch()


def _judge_failed_task(task_dir: Path) -> None:
    """An MT-Bench task the judge failed: the hook counted, then raised; the client log holds its message."""
    out = task_dir / "output"
    out.mkdir(parents=True)
    (out / JUDGE_ERRORS_FILE).write_text(json.dumps({"errors": 1, "judgments": 4, "max_error_rate": 0.05}))
    try:
        check_judgments(_judgments([7, 7, 7, -1]), 0.05)
    except JudgeFailures as exc:
        (task_dir / "client.log").write_text(f"Traceback (most recent call last):\n  ...\nJudgeFailures: {exc}\n")
    (task_dir / "state").write_text("failed 1\n")


def _collect(tmp_path: Path) -> InvocationResults:
    job = tmp_path / "job"
    _scored_task(job / "tasks" / "mtbench", errors=1, judgments=4)
    _judge_failed_task(job / "tasks" / "mtbench-cor1")
    tasks = [("mtbench", "tasks/mtbench"), ("mtbench-cor1", "tasks/mtbench-cor1")]
    return collect_results(job, tasks, invocation="jjjj0001", created="2026-11-29T00:00:00Z", model="/ckpt")


def test_judge_errors_are_in_results_json_for_a_scored_and_a_failed_task(tmp_path: Path) -> None:
    results = _collect(tmp_path)
    scored, failed = results.tasks["mtbench"], results.tasks["mtbench-cor1"]
    assert scored.status == "succeeded" and scored.metrics["average_score"].value == 7.0
    assert "judge_errors" not in scored.metrics  # a count of the judge's failures is not a score of the model
    assert failed.status == "failed" and not failed.metrics and results.status == "failed"
    assert failed.error is not None and failed.error.startswith("Judge errors 1 of 4: more than 5%")
    assert failed.hint is not None and "judge.max_error_rate" in failed.hint
    path = write_results(tmp_path, results)
    on_disk = json.loads(path.read_text())["tasks"]
    assert on_disk["mtbench"]["judge_errors"] == {"errors": 1, "judgments": 4, "max_error_rate": 0.5}
    assert on_disk["mtbench-cor1"]["judge_errors"]["errors"] == 1
    assert read_results(path) == results


def test_the_table_says_them_beside_the_score_and_prints_no_score_for_the_failed_task(tmp_path: Path) -> None:
    text = render_text([_collect(tmp_path)])
    rows = [[c.strip() for c in line.split("|")] for line in text.splitlines() if "|" in line]
    scored = rows.index(["mtbench", "average_score", "7.0000", ""])
    assert rows[scored + 1] == ["", "judge errors", "1 of 4", ""]
    failed = [r for r in rows if r[0] == "mtbench-cor1"]
    assert failed == [["mtbench-cor1", "failed", "—", ""]]  # no score, and its judge errors under it
    assert rows[rows.index(failed[0]) + 1] == ["", "judge errors", "1 of 4", ""]
    assert "✗ mtbench-cor1 failed: Judge errors 1 of 4" in text
    assert max(len(line) for line in text.splitlines() if "|" in line) <= 80  # the rows (rich wraps the notes)


def test_a_judged_task_whose_harness_does_not_count_says_not_counted(tmp_path: Path) -> None:
    import dataclasses

    from ckpteval.results.provenance import Provenance

    results = _collect(tmp_path)
    plain = dataclasses.replace(results.tasks["mtbench"], name="AIME_2025", judge_errors=None)
    judge = {"role": "judge", "kind": "api", "model_id": "judge-x", "url": "http://j/v1", "tasks": ["AIME_2025"]}
    results = dataclasses.replace(results, tasks={"AIME_2025": plain}, provenance=Provenance(judge=judge))
    text = render_text([results])
    assert ["", "judge errors", "not counted", ""] in [
        [c.strip() for c in line.split("|")] for line in text.splitlines() if "|" in line
    ]
    assert "AIME_2025: judged by api judge-x http://j/v1; its harness does not count" in text


def test_exports_and_the_delegate_carry_them_as_metrics(tmp_path: Path) -> None:
    results = _collect(tmp_path)
    values = metric_values(results)
    assert values["mtbench/judge_errors"] == 1.0 and values["mtbench/judge_judgments"] == 4.0
    assert values["mtbench-cor1/judge_errors"] == 1.0  # a failed task's too: why it has no score
    assert "mtbench-cor1/average_score" not in values
    raw = {"mtbench": raw_metrics(results.tasks["mtbench"])}
    flat = flat_delegate_metrics(raw)
    assert flat["eval/mtbench/greedy/average_score"] == 7.0
    assert flat["eval/mtbench/greedy/judge_errors"] == 1.0 and flat["eval/mtbench/greedy/judge_judgments"] == 4.0


def test_the_status_summary_names_them(tmp_path: Path, isolated_user: Path) -> None:
    from ckpteval.invocation.record import InvocationRecord, TaskEntry
    from ckpteval.views import judge_errors, score_summary

    results = _collect(tmp_path)
    write_results(tmp_path, results)
    record = InvocationRecord(
        id="jjjj0001",
        created="2026-11-29T00:00:00Z",
        mode="local",
        profile="local",
        executor="local",
        job_dir=str(tmp_path / "job"),
        tasks=[TaskEntry("mtbench", "tasks/mtbench"), TaskEntry("mtbench-cor1", "tasks/mtbench-cor1")],
        local_results_dir=str(tmp_path),
    )
    summary = score_summary(record)
    assert "mtbench 7.0000 (judge errors 1 of 4)" in summary
    assert "mtbench-cor1 failed (judge errors 1 of 4)" in summary
    assert {name: c.text() for name, c in judge_errors(record).items()} == {
        "mtbench": "judge errors 1 of 4",
        "mtbench-cor1": "judge errors 1 of 4",
    }
