"""`evaluate samples`: each document's prompt, answer, target and score, and the flips between two invocations,
on job directories laid out as real runs leave them (lm-eval's samples files, collected into samples.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from tests.support.lm_eval_runs import gsm8k_run, hellaswag_run, humaneval_run, record_run

runner = CliRunner(env={"COLUMNS": "220"})
N = 12
BASE = [i < 8 for i in range(N)]  # documents 0-7 right
CAND = [i < 5 or i == 10 for i in range(N)]  # loses 5, 6, 7; gains 10


@pytest.fixture
def runs(tmp_path: Path) -> None:
    record_run(
        tmp_path,
        "aaaa0001",
        {
            "hellaswag": lambda d: hellaswag_run(d, BASE),
            "gsm8k": lambda d: gsm8k_run(d / "output", BASE),
            "adlr_humaneval_greedy": humaneval_run,
        },
    )
    record_run(
        tmp_path,
        "bbbb0002",
        {
            "hellaswag": lambda d: hellaswag_run(d, CAND),
            "gsm8k": lambda d: gsm8k_run(d / "output", CAND),
        },
    )


def _json(*args: str) -> dict:
    result = runner.invoke(app, ["samples", *args, "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def test_each_document_with_its_prompt_answer_target_and_score(runs: None) -> None:
    result = runner.invoke(app, ["samples", "aaaa0001", "-t", "hellaswag"])
    assert result.exit_code == 0, result.output
    assert "aaaa0001 hellaswag: 12 documents, scored by acc" in result.output
    # document 9: the model chose ending 2 of context 9 (wrong), the gold one is ending 1
    line = next(x for x in result.output.splitlines() if "hellaswag/9 " in x)
    assert "Context 9: a person" in line and "ending 2 of context 9." in line and "ending 1 of context 9." in line
    [doc9] = [d for d in _json("aaaa0001", "-t", "hellaswag")["tasks"]["hellaswag"] if d["sample"] == "hellaswag/9"]
    assert (doc9["prompt"], doc9["response"], doc9["target"]) == (
        "Context 9: a person",
        "ending 2 of context 9.",
        "ending 1 of context 9.",
    )
    assert doc9["score"] == 0.0 and doc9["right"] is False


def test_wrong_and_right_select_documents(runs: None) -> None:
    wrong = _json("aaaa0001", "-t", "gsm8k", "--wrong")["tasks"]["gsm8k"]
    right = _json("aaaa0001", "-t", "gsm8k", "--right")["tasks"]["gsm8k"]
    assert [d["sample"] for d in wrong] == [f"gsm8k/{i}" for i in range(8, 12)]
    assert [d["sample"] for d in right] == [f"gsm8k/{i}" for i in range(8)]
    # the answer the metric scored (strict-match's) and what the model said
    assert wrong[0]["answer"] == "11" and wrong[0]["response"] == "They have 11 apples. #### 11"
    assert wrong[0]["target"].endswith("#### 10") and wrong[0]["metric"] == "exact_match__strict-match"


def test_every_task_by_default_humaneval_included(runs: None) -> None:
    tasks = _json("aaaa0001")["tasks"]
    assert list(tasks) == ["hellaswag", "gsm8k", "adlr_humaneval_greedy"]
    code = tasks["adlr_humaneval_greedy"]
    assert [d["score"] for d in code] == [1.0, 0.0, 1.0, 0.0]  # the recorded run: problems 0 and 2 pass
    assert code[1]["response"] == "    while True:\n        pass\n"  # the infinite loop it was served
    assert code[1]["prompt"].startswith("from typing import List") and "check(" in code[1]["target"]


def test_vs_shows_the_flips_worst_first(runs: None) -> None:
    data = _json("aaaa0001", "--vs", "bbbb0002", "-t", "gsm8k")
    assert (data["baseline"], data["candidate"]) == ("aaaa0001", "bbbb0002")
    flips = data["tasks"]["gsm8k"]
    assert [(f["sample"], f["kind"]) for f in flips] == [
        ("gsm8k/5", "right → wrong"),
        ("gsm8k/6", "right → wrong"),
        ("gsm8k/7", "right → wrong"),
        ("gsm8k/10", "wrong → right"),
    ]
    assert (flips[0]["baseline"]["answer"], flips[0]["candidate"]["answer"]) == ("7", "8")
    shown = runner.invoke(app, ["samples", "aaaa0001", "--vs", "bbbb0002"])
    assert shown.exit_code == 0, shown.output
    # both tasks they share; humaneval ran only in the first
    assert "gsm8k exact_match__strict-match: aaaa0001 → bbbb0002: 3 right → wrong, 1 wrong → right" in shown.output
    assert "hellaswag acc: aaaa0001 → bbbb0002: 3 right → wrong, 1 wrong → right" in shown.output
    assert "(4 changed of 12 documents both scored)" in shown.output
    assert "humaneval" not in shown.output
    assert "1 → 0" in shown.output and "0 → 1" in shown.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ffff9999"], "No invocation 'ffff9999'"),
        (["aaaa0001", "-t", "mmlu"], "Invocation aaaa0001 has no task 'mmlu'"),
        (["aaaa0001", "--vs", "ffff9999"], "No invocation 'ffff9999'"),
        (["aaaa0001", "--vs", "bbbb0002", "-t", "adlr_humaneval_greedy"], "Invocation bbbb0002 has no task"),
        (["aaaa0001", "--wrong", "--right"], "--wrong and --right exclude each other"),
        (["aaaa0001", "--vs", "bbbb0002", "--wrong"], "--vs shows the flips"),
        (["aaaa0001", "-t", "gsm8k", "--metric", "bleu"], "has no per-sample scores of 'bleu'"),
    ],
)
def test_bad_input_is_one_message(runs: None, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["samples", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


LEAF = "mmlu_str_high_school_european_history"  # a long leaf task: its documents' ids are long words


@pytest.mark.parametrize("width", [80, 140])
def test_document_ids_are_never_broken(tmp_path: Path, width: int) -> None:
    for name, right in (("cccc0003", BASE), ("dddd0004", CAND)):
        record_run(tmp_path, name, {"gsm8k": lambda d, r=right: gsm8k_run(d / "output", r, harness_task=LEAF)})
    for args in (["samples", "cccc0003"], ["samples", "cccc0003", "--vs", "dddd0004"]):
        result = CliRunner().invoke(app, args, terminal_width=width, env={"COLUMNS": str(width)})
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert all(len(line) <= width for line in lines), result.output
        # every document shown has its whole id on one line (not cut into mmlu_str_high_sch + ool_...)
        shown = {d for d in range(N) if any(f"{LEAF}/{d} " in line for line in lines)}
        assert shown == (set(range(N)) if "--vs" not in args else {5, 6, 7, 10}), result.output
