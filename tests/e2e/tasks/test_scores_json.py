"""`evaluate -t adlr_mmlu --limit 1 --json` end to end against a real HTTP endpoint that answers `A` to every
question: lm-eval's own run of MMLU (one question per subject, 57), the results as JSON alone on stdout, the
score table on stderr saying what guessing scores (MMLU: a letter among 4 choices, 0.25), and `evaluate status`
without an id showing this invocation, the latest, in full."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.tasks.conftest import FakeEndpoint

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_mmlu_results_as_json_with_their_chance_level(fake_endpoint: Callable[..., FakeEndpoint], tmp_path: Path):
    endpoint = fake_endpoint("--answer", "A")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CKPTEVAL_")},
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "COLUMNS": "80",
    }
    argv = [
        sys.executable, "-m", "ckpteval.cli", "-t", "adlr_mmlu", "--limit", "1", "--json", "deployment=none",
        f"target.api_endpoint.url={endpoint.url}",
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    results = json.loads(proc.stdout)  # stdout is the results, nothing else
    (job_dir,) = (tmp_path / "results").iterdir()
    assert results == json.loads((job_dir / "results.json").read_text())
    task = results["tasks"]["adlr_mmlu"]
    assert task["chance"] == pytest.approx(0.25)  # every document a letter among its 4 choices
    metric = task["metrics"]["exact_match"]
    assert metric["n_samples"] == 57
    # answering A is right where A is the gold letter: the score the samples say, beside its chance level
    rows = [json.loads(line) for line in (job_dir / "tasks/adlr_mmlu/samples.jsonl").read_text().splitlines()]
    assert {r["choices"] for r in rows} == {4}
    assert metric["value"] == pytest.approx(sum(r["target"] == "A" for r in rows) / 57)
    at = abs(metric["value"] - 0.25) <= 1.959964 * metric["stderr"]
    said = f"{metric['value']:.4f} ± {metric['stderr']:.4f} ({'at chance: 0.25' if at else 'chance 0.25'})"
    assert said in " ".join(proc.stderr.split()), proc.stderr[-3000:]

    status = subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", "status"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert status.returncode == 0, status.stderr
    flat = " ".join(status.stdout.split())
    assert f"the latest invocation ({job_dir.name})" in flat and f"{job_dir.name} succeeded" in flat, status.stdout
    assert f"adlr_mmlu {metric['value']:.4f} n=57 ({'at chance: 0.25' if at else 'chance 0.25'})" in flat, flat
