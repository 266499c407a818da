"""`evaluate -t gsm8k:3` end to end against a real HTTP endpoint whose answers depend on the seed.

The endpoint (fake_endpoint.py --answer gsm8k-seeded) answers packaged GSM8K row r at seed s right,
wrong (the answer + 1) or with no number, by `gsm8k_seeded_rule(r, s)`, so every mode's value is known
by hand. For the first 4 rows (answers 18, 5, 40, 1430) and seeds 0, 1, 2:

    row 0: right "18",  wrong "19",   right "18"    -> 2 right, majority "18" (right)
    row 1: none,        wrong "6",    right "5"     -> 1 right, tie "5"/"6" -> "5" (right)
    row 2: wrong "41",  right "40",   none          -> 1 right, tie "40"/"41" -> "40" (right)
    row 3: wrong "1431", right "1430", wrong "1431" -> 1 right, majority "1431" (wrong)

pass@1[avg-of-3] = 5/12; the runs score 1/4, 2/4, 2/4 (std-dev sqrt(1/48), std-err 1/12);
majority@3 = 3/4; pass@3 = 1 (every row has a right sample).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.tasks.conftest import FakeEndpoint

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXPECTED = {
    "pass@1[avg-of-3]": 5 / 12,
    "majority@3": 3 / 4,
    "pass@3": 1.0,
}


def test_repeated_gsm8k_through_evaluate(fake_endpoint: Callable[..., FakeEndpoint], tmp_path: Path) -> None:
    body_log = tmp_path / "bodies.jsonl"
    endpoint = fake_endpoint("--answer", "gsm8k-seeded", "--body-log", str(body_log))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CKPTEVAL_")},
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "COLUMNS": "200",
    }
    argv = [
        sys.executable, "-m", "ckpteval.cli", "-t", "gsm8k:3", "deployment=none",
        f"target.api_endpoint.url={endpoint.url}",
        "evaluation.nemo_evaluator_config.config.params.limit_samples=4",
        "evaluation.nemo_evaluator_config.config.params.parallelism=2",
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    # every request of repeat i carried seed i at the sampling temperature ckpteval chose for a greedy task
    bodies = [json.loads(line) for line in body_log.read_text().splitlines()]
    assert Counter(b["seed"] for b in bodies) == {0: 4, 1: 4, 2: 4}
    assert {(b["temperature"], b["top_p"]) for b in bodies} == {(0.7, 0.95)}

    (job_dir,) = (tmp_path / "results").iterdir()
    task = json.loads((job_dir / "results.json").read_text())["tasks"]["gsm8k"]
    assert task["status"] == "succeeded" and task["repeats"] == 3
    assert list(task["modes"]) == list(EXPECTED)
    for mode, value in EXPECTED.items():
        for metric in ("exact_match__strict-match", "exact_match__flexible-extract"):
            assert task["modes"][mode][metric]["value"] == pytest.approx(value), (mode, metric)
            assert task["modes"][mode][metric]["n_samples"] == 4
    avg = task["modes"]["pass@1[avg-of-3]"]["exact_match__strict-match"]
    assert avg["std_dev"] == pytest.approx(math.sqrt(1 / 48))
    assert avg["stderr"] == pytest.approx(1 / 12)
    assert task["metrics"]["exact_match__strict-match"]["value"] == pytest.approx(5 / 12)  # the headline

    # the score table: one row per mode and metric, the mode named once per group
    out = proc.stdout
    for line in ("pass@1[avg-of-3]", "majority@3", "pass@3"):
        assert line in out
    assert "0.4167" in out and "0.7500" in out and "1.0000" in out
    # each repeat kept its own output, and is marked done
    for i in range(3):
        assert (job_dir / f"tasks/gsm8k/output-rs{i}/.done").is_file()

    # `evaluate logs INVOCATION -s gsm8k` shows the newest repeat's client log
    logs = subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", "logs", job_dir.name, "--source", "gsm8k"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert logs.returncode == 0, logs.stderr
    newest = (job_dir / "tasks/gsm8k/client-rs2.log").read_text(errors="replace").splitlines()
    assert newest and logs.stdout.splitlines() == newest
