"""Why a task failed, from real client logs (golden copies of real failing `nemo-evaluator run_eval` runs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ckpteval.execution.snapshot import LocalJobView, take_snapshot
from ckpteval.results.collect import task_outcome
from ckpteval.tasks.failure import REQUEST_TIMEOUT_SETTING, explain_failure, explain_log

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize(
    ("case", "reason", "hint"),
    [
        ("fail_http500", 'Last endpoint error: {"error": "injected failure: model worker crashed"}', "deployment log"),
        ("fail_endpoint_dead", "Connection refused", "deployment log"),  # through nemo-evaluator's proxy
        ("fail_endpoint_dead_no_proxy", "stopped answering", "deployment log"),  # lm-eval straight to it
        ("fail_timeout", "timed out", REQUEST_TIMEOUT_SETTING),
        ("fail_no_offline_data", "No offline copy of dataset TIGER-Lab/MMLU-Pro", "dataset_dir"),
    ],
)
def test_each_real_failure_says_why_in_one_line_with_its_log_and_a_hint(case: str, reason: str, hint: str) -> None:
    log = GOLDEN / case / "client.log"
    why = explain_failure(GOLDEN / case / "artifacts", log)
    assert reason in why.reason
    assert "\n" not in why.reason and not why.reason.startswith(("  ", "File ")), "one line, never a Python frame"
    assert why.log == str(log)
    assert hint in (why.hint or "")


def test_an_unknown_failure_gives_the_last_exception_line() -> None:
    text = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: bad task name\n'
    why = explain_log(text, log="tasks/t/client.log")
    assert why.reason == "The task failed: ValueError: bad task name" and why.hint is None


def test_a_failed_task_carries_why_into_results_and_status(tmp_path: Path) -> None:
    job = tmp_path / "job"
    task = job / "tasks" / "hellaswag"
    shutil.copytree(GOLDEN / "fail_http500", task)
    (task / "state").write_text("failed 1\n")

    outcome = task_outcome(task, "hellaswag")  # what results.json gets
    assert outcome.status == "failed" and "injected failure" in (outcome.error or "")
    assert outcome.log == str(task / "client.log") and "deployment log" in (outcome.hint or "")

    (snap,) = take_snapshot(LocalJobView(job), [("hellaswag", "tasks/hellaswag")], None).tasks  # `evaluate status`
    assert snap.state == "failed 1" and snap.error == outcome.error
    assert snap.log == "tasks/hellaswag/client.log" and snap.hint == outcome.hint
