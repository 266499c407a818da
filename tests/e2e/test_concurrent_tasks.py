"""Tasks side by side against the one deployment score exactly what they score one after another.

Two invocations of `evaluate -c tiny` (SmolLM2 on the builtin server, on this machine) with the same two
tasks and the same items: `evaluation.max_parallel_tasks=1` (one after another) and the default (both at
once). Greedy decoding and log-likelihoods do not depend on what else the server batches, so every metric
must be identical; each task keeps its own directory, log and `.done` marker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EVALUATE = [sys.executable, "-m", "ckpteval.cli"]
TASKS = ("hellaswag", "gsm8k")


def _run(root: Path, *overrides: str) -> tuple[Path, dict]:
    cwd = root / "work"
    cwd.mkdir(parents=True)
    env = {**os.environ, "XDG_STATE_HOME": str(root / "state"), "XDG_CONFIG_HOME": str(root / "config")}
    argv = [*EVALUATE, "-c", "tiny", *(a for t in TASKS for a in ("-t", t))]
    argv += ["evaluation.nemo_evaluator_config.config.params.limit_samples=2", *overrides]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    invocation = re.search(r"invocation\s+([0-9a-f]{8})", proc.stdout).group(1)  # type: ignore[union-attr]
    job_dir = cwd / "results" / invocation
    return job_dir, json.loads((job_dir / "results.json").read_text())


@pytest.mark.long  # 5.5 min: two full invocations; the scheduling is unit-tested, the gain benchmarked
def test_concurrent_scores_equal_sequential(tmp_path: Path) -> None:
    seq_dir, sequential = _run(tmp_path / "sequential", "evaluation.max_parallel_tasks=1")
    con_dir, concurrent = _run(tmp_path / "concurrent")
    assert "MAX_PARALLEL_TASKS=1" in (seq_dir / "job.sh").read_text()
    assert f"MAX_PARALLEL_TASKS={len(TASKS)}" in (con_dir / "job.sh").read_text()
    for task in TASKS:
        seq, con = sequential["tasks"][task], concurrent["tasks"][task]
        assert seq["status"] == con["status"] == "succeeded"
        assert con["metrics"] == seq["metrics"], task
        assert (con_dir / "tasks" / task / ".done").is_file() and (con_dir / "tasks" / task / "client.log").is_file()
    # both clients were running at once: each started before the other finished
    log = (con_dir / "logs" / "job.log").read_text() if (con_dir / "logs" / "job.log").exists() else ""
    started = [line for line in log.splitlines() if ": running" in line]
    first_done = next(i for i, line in enumerate(log.splitlines()) if "succeeded" in line)
    assert len(started) == len(TASKS) and all(log.splitlines().index(s) < first_done for s in started)
