"""`evaluate compare` on recorded invocations: the table, --json, and the regression gate's exit code."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.results.compare import REGRESSION_EXIT_CODE
from tests.support.comparisons import record_invocation, sample_rows

runner = CliRunner(env={"COLUMNS": "220"})
N = 200
# the builtin server, its identity verified: a run without caveats
SERVED = {"kind": "megatron/builtin", "identity": "ckpteval-xyz", "serving": {"device": "cpu", "dtype": "auto"}}


def _scores(p_right: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [1.0 if rng.random() < p_right else 0.0 for _ in range(N)]


@pytest.fixture
def invocations(tmp_path: Path) -> dict[str, list[float]]:
    base = _scores(0.7, 1)
    # a real regression: 40 of the baseline's right answers turned wrong
    right = [i for i, v in enumerate(base) if v == 1.0]
    regressed = list(base)
    for i in right[:40]:
        regressed[i] = 0.0
    # noise: 4 answers changed each way
    wrong = [i for i, v in enumerate(base) if v == 0.0]
    noisy = list(base)
    for i in right[-4:]:
        noisy[i] = 0.0
    for i in wrong[:4]:
        noisy[i] = 1.0
    for name, scores in (("aaaa0001", base), ("bbbb0002", regressed), ("cccc0003", noisy)):
        record_invocation(
            tmp_path / "jobs", name, {"mmlu": sample_rows("mmlu", {"exact_match": scores})}, served=SERVED
        )
    return {"base": base, "regressed": regressed, "noisy": noisy}


def test_table_shows_the_difference_ci_test_and_verdict(invocations):
    result = runner.invoke(app, ["compare", "aaaa0001", "bbbb0002", "cccc0003"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "bbbb0002 vs baseline aaaa0001" in out and "cccc0003 vs baseline aaaa0001" in out
    assert "-0.2000" in out  # 40 of 200 lost
    assert "exact McNemar" in out and "worse" in out and "no evidence" in out
    assert "Holm" in out and "power 80%" in out


def test_json_and_baseline_option(invocations):
    result = runner.invoke(app, ["compare", "bbbb0002", "--baseline", "aaaa0001", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["baseline"] == "aaaa0001" and data["candidates"] == ["bbbb0002"]
    [row] = data["rows"]
    assert row["verdict"] == "worse" and row["p_value"] == pytest.approx(2 / 2**40)
    assert row["n"] == N and data["correction"] == "holm" and (data["alpha"], data["power"]) == (0.05, 0.8)


def test_gate_fails_on_a_real_regression_and_says_why(invocations):
    result = runner.invoke(
        app, ["compare", "--baseline", "aaaa0001", "bbbb0002", "--fail-on-regression", "--max-drop", "0.01"]
    )
    assert result.exit_code == REGRESSION_EXIT_CODE == 3
    assert "regression:" in result.output
    assert "bbbb0002 is worse than aaaa0001 on mmlu exact_match" in result.output
    assert "allowed drop 0.01" in result.output


def test_gate_passes_on_noise_and_on_a_drop_within_the_allowance(invocations):
    noise = runner.invoke(app, ["compare", "--baseline", "aaaa0001", "cccc0003", "--fail-on-regression"])
    assert noise.exit_code == 0, noise.output
    assert "regression:" not in noise.output
    allowed = runner.invoke(
        app, ["compare", "-b", "aaaa0001", "bbbb0002", "--fail-on-regression", "--max-drop", "0.25"]
    )
    assert allowed.exit_code == 0, allowed.output


def test_bad_input_is_one_message(invocations):
    one = runner.invoke(app, ["compare", "aaaa0001"])
    assert one.exit_code == 2 and "at least two invocations" in one.output
    unknown = runner.invoke(app, ["compare", "aaaa0001", "ffff9999"])
    assert unknown.exit_code == 2 and "No invocation 'ffff9999'" in unknown.output
    negative = runner.invoke(app, ["compare", "aaaa0001", "bbbb0002", "--max-drop", "-1"])
    assert negative.exit_code == 2 and "--max-drop" in negative.output
    assert "Traceback" not in one.output + unknown.output + negative.output


def test_a_warning_when_the_runs_differ_in_more_than_the_model(tmp_path: Path) -> None:
    """Two runs of one task with different request settings: their difference is not only the model's."""
    scores = {"mmlu": sample_rows("mmlu", {"exact_match": _scores(0.6, 7)})}
    params = {"task": "mmlu_str", "temperature": 0.0, "limit_samples": None, "extra": {"num_fewshot": 5}}
    record_invocation(tmp_path, "dddd0004", scores, settings={"mmlu": params})
    same = {**params, "parallelism": 16, "extra": {"num_fewshot": 5, "tokenizer": "/elsewhere"}}  # transport only
    record_invocation(tmp_path, "eeee0005", scores, settings={"mmlu": same})
    other = {**params, "extra": {"num_fewshot": 0}}
    record_invocation(tmp_path, "ffff0006", scores, settings={"mmlu": other})

    quiet = runner.invoke(app, ["compare", "dddd0004", "eeee0005"])
    assert quiet.exit_code == 0, quiet.output
    assert "warning" not in quiet.output
    warned = runner.invoke(app, ["compare", "dddd0004", "ffff0006"])
    assert warned.exit_code == 0, warned.output
    text = " ".join(warned.output.split())
    assert "warning: ffff0006 vs dddd0004: mmlu's request settings differ (extra.num_fewshot: 5 vs 0)" in text
    assert "not only the model's" in text
    data = json.loads(runner.invoke(app, ["compare", "dddd0004", "ffff0006", "--json"]).output)
    assert data["warnings"] == ["ffff0006 vs dddd0004: mmlu's request settings differ (extra.num_fewshot: 5 vs 0)"]
