"""A score that is not a verified score of its model says so wherever it is read, at 80 columns: the score
table (`evaluate results`, the run's closing screen), `evaluate status ID`, `evaluate compare` (whose gate
fails on it unless `--allow-caveats`) and its differences: origin, endpoint, deployment kind, device, dtype,
prefix cache, and a side without provenance."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.results.compare import REGRESSION_EXIT_CODE, UNTRUSTED_EXIT_CODE
from tests.support.comparisons import record_invocation, sample_rows

runner = CliRunner(env={"COLUMNS": "80"})
VERIFIED = {"kind": "megatron/builtin", "identity": "ckpteval-1234", "serving": {"device": "cpu", "dtype": "auto"}}
# an existing endpoint shared with other clients, its probe found mixing, and an origin mismatch run anyway
SHARED = {"kind": "none", "url": "http://10.0.0.5:9000/v1/completions", "endpoint_owned": False}
ORIGIN = {
    "origin": "HuggingFaceTB/SmolLM2-135M",
    "disagreements": ["rotary_base 10000 vs rope_theta 100000"],
    "mismatch_ignored": True,
}
PROBE = {"verdict": "mixed", "reason": "3 of 20 answers differ", "seconds": 2.0, "left_out": []}


def _scores(seed: int, n: int = 100) -> list[float]:
    rng = random.Random(seed)
    return [1.0 if rng.random() < 0.5 else 0.0 for _ in range(n)]


@pytest.fixture
def runs(tmp_path: Path) -> None:
    same = {"mmlu": sample_rows("mmlu", {"exact_match": _scores(1)})}
    record_invocation(tmp_path, "aaaa0001", same, served=VERIFIED)
    record_invocation(tmp_path, "aaaa0002", same, served=VERIFIED)
    record_invocation(
        tmp_path,
        "bbbb0002",
        same,
        served=SHARED,
        job_yaml={"origin": ORIGIN},
        files={"state/request_probe.json": json.dumps(PROBE)},
    )
    record_invocation(tmp_path, "cccc0003", same)  # written before provenance was recorded


def _fits(output: str) -> None:
    assert max(len(line) for line in output.splitlines()) <= 80, output


def test_the_score_table_and_status_show_the_caveats(runs: None) -> None:
    table = runner.invoke(app, ["results", "bbbb0002"])
    assert table.exit_code == 0, table.output
    text = " ".join(table.output.split())
    assert "⚠ origin mismatch ignored: the checkpoint's args disagree with HuggingFaceTB/SmolLM2-135M" in text
    assert "rotary_base 10000 vs rope_theta 100000" in text
    assert "⚠ endpoint not verified: the deployment (none) cannot report the job's identity" in text
    assert "⚠ settings mixed: the shared endpoint's request-settings probe says mixed" in text
    _fits(table.output)
    clean = runner.invoke(app, ["results", "aaaa0001"])
    assert clean.exit_code == 0 and "⚠" not in clean.output
    bare = runner.invoke(app, ["results", "cccc0003"])
    assert "⚠ no provenance" in bare.output

    status = runner.invoke(app, ["status", "bbbb0002"])
    assert status.exit_code == 0, status.output
    text = " ".join(status.output.split())
    assert "⚠ origin mismatch ignored" in text and "⚠ endpoint not verified" in text
    _fits(status.output)
    assert "⚠" not in runner.invoke(app, ["status", "aaaa0001"]).output


def test_compare_names_every_difference_and_the_gate_fails_on_them(runs: None) -> None:
    result = runner.invoke(app, ["compare", "aaaa0001", "bbbb0002"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "caveat: bbbb0002: endpoint not verified" in text
    for difference in (
        "the origin check differs (not checked vs mismatch with HuggingFaceTB/SmolLM2-135M ignored)",
        "the endpoint's identity differs (verified vs not verified)",
        "the deployment kind differs (megatron/builtin vs none)",
        "the deployment's device differs (cpu vs not recorded)",
        "the deployment's dtype differs (auto vs not recorded)",
    ):
        assert f"warning: bbbb0002 vs aaaa0001: {difference}; the difference is not only the model's" in text
    _fits(result.output)

    # the same scores: no regression, but the gate cannot say so
    gate = runner.invoke(app, ["compare", "aaaa0001", "bbbb0002", "--fail-on-regression"])
    assert gate.exit_code == UNTRUSTED_EXIT_CODE == 4, gate.output
    assert "not trusted:" in gate.output and "--allow-caveats" in gate.output
    _fits(gate.output)
    allowed = runner.invoke(app, ["compare", "aaaa0001", "bbbb0002", "--fail-on-regression", "--allow-caveats"])
    assert allowed.exit_code == 0, allowed.output
    assert "caveat: bbbb0002" in allowed.output  # still printed
    data = json.loads(runner.invoke(app, ["compare", "aaaa0001", "bbbb0002", "--json"]).output)
    assert "bbbb0002" in data["caveats"] and "aaaa0001" not in data["caveats"]

    # two verified runs of one setup: nothing to warn of, the gate passes
    quiet = runner.invoke(app, ["compare", "aaaa0001", "aaaa0002", "--fail-on-regression"])
    assert quiet.exit_code == 0, quiet.output
    assert "caveat" not in quiet.output and "warning" not in quiet.output


def test_a_side_without_provenance_is_said_not_passed_over(runs: None) -> None:
    result = runner.invoke(app, ["compare", "aaaa0001", "cccc0003"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "caveat: cccc0003: no provenance" in text
    assert "warning: cccc0003 vs aaaa0001: the candidate records no provenance: nothing says what else differs" in text
    gate = runner.invoke(app, ["compare", "aaaa0001", "cccc0003", "--fail-on-regression"])
    assert gate.exit_code == UNTRUSTED_EXIT_CODE, gate.output
    assert REGRESSION_EXIT_CODE != UNTRUSTED_EXIT_CODE
