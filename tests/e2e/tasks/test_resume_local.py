"""`evaluate resume` on this machine: a job whose endpoint died mid-task runs again in its own directory,
the harness replays the answers it had already received, and only the rest reach the endpoint.

Deployment `none` against fake_endpoint.py (real HTTP), so no model is loaded; about a minute, most of
it the harness's start-up, twice.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.e2e.tasks.conftest import FakeEndpoint

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SAMPLES = 12
SERVED_BEFORE_DYING = 5
EVALUATE = [sys.executable, "-m", "ckpteval.cli"]


def _evaluate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([*EVALUATE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_resume_replays_what_was_answered_and_asks_only_for_the_rest(
    fake_endpoint: Callable[..., FakeEndpoint], isolated_user: Path
) -> None:
    dying = fake_endpoint("--fail-after", str(SERVED_BEFORE_DYING), "--failure", "die")
    params = "evaluation.nemo_evaluator_config.config.params"
    first = _evaluate(
        isolated_user,
        "-c",
        "tiny",
        "-t",
        "gsm8k",
        "deployment=none",
        f"target.api_endpoint.url={dying.url}",
        f"{params}.limit_samples={SAMPLES}",
        f"{params}.parallelism=1",
        f"{params}.max_retries=1",
        f"{params}.request_timeout=10",
    )
    assert first.returncode == 1, first.stdout + first.stderr
    invocation = re.search(r"invocation\s+([0-9a-f]{8})", first.stdout).group(1)  # type: ignore[union-attr]
    job_dir = isolated_user / "results" / invocation
    assert (job_dir / "tasks" / "gsm8k" / "state").read_text().startswith("failed")
    assert len(dying.received()) == SERVED_BEFORE_DYING + 1  # the request it died on

    # the endpoint comes back where it was (same port, so the same count file); resume asks it only for
    # what is missing
    before = dying.received()
    back = fake_endpoint(port=urlparse(dying.url).port)
    resumed = _evaluate(isolated_user, "resume", invocation)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    asked = back.received()[len(before) :]
    assert len(asked) == SAMPLES - SERVED_BEFORE_DYING
    answered_before = {digest for _, digest, _ in before[:SERVED_BEFORE_DYING]}
    assert answered_before.isdisjoint(digest for _, digest, _ in asked)

    results = json.loads((job_dir / "results.json").read_text())
    assert results["status"] == "succeeded"
    assert results["tasks"]["gsm8k"]["metrics"]
    assert "gsm8k" in resumed.stdout  # the score table

    # resuming a finished invocation says so and runs nothing again (its job is not started: no deployment)
    log_before = (job_dir / "logs" / "job.log").read_text()
    again = _evaluate(isolated_user, "resume", invocation)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"invocation {invocation} succeeded already: nothing to resume" in again.stderr
    assert len(back.received()) == len(before) + len(asked)
    assert (job_dir / "logs" / "job.log").read_text() == log_before
