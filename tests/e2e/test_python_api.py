"""`import ckpteval; ckpteval.run(...)` from Python: the tiny evaluation runs, nothing is printed, the scores
come back — and the same invocation is then found by `ckpteval.status` / `ckpteval.results`.

The model is the tiny packaged one behind the session's shared builtin server (as in test_delegate.py),
evaluated on a few zero-shot GSM8K problems, so the whole test takes about a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import ServedModel

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SCRIPT = """
import json, sys
import ckpteval
outcome = ckpteval.run(configs=["tiny"], tasks=["gsm8k"], overrides=sys.argv[1:])
again = ckpteval.results(outcome.invocation)
state = ckpteval.status(outcome.invocation).state
sys.__stdout__.write(json.dumps({"invocation": outcome.invocation, "exit": outcome.exit_status,
    "state": outcome.state, "scores": outcome.scores, "again": again.to_json(), "status": state}))
"""


def test_run_from_python_prints_nothing_and_returns_the_scores(
    served_model: Callable[[str], ServedModel], tmp_path: Path
) -> None:
    model = served_model("tiny")
    overrides = model.gsm8k_overrides()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CKPTEVAL_")},
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONWARNINGS": "ignore",
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *overrides], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr == ""  # the library printed nothing itself: no progress, no table, no preview
    out = json.loads(proc.stdout)  # and nothing on stdout but what the script wrote
    assert (out["exit"], out["state"], out["status"]) == (0, "succeeded", "succeeded")
    gsm8k = out["scores"]["gsm8k"]
    assert gsm8k and all(0.0 <= value <= 1.0 for value in gsm8k.values())
    # the same scores as results.json, which `ckpteval.results` (and `evaluate results`) read later
    saved = out["again"]["tasks"]["gsm8k"]
    assert {name: metric["value"] for name, metric in saved["metrics"].items()} == gsm8k
    job_dir = tmp_path / "results" / out["invocation"]
    assert json.loads((job_dir / "results.json").read_text())["tasks"]["gsm8k"]["status"] == "succeeded"


def test_the_builtin_server_honours_each_requests_settings(
    served_model: Callable[[str], ServedModel], tmp_path: Path
) -> None:
    """The request-settings probe the job runs before any task's first request: straight against the builtin
    server it says `honoured` (a `-c tiny` job runs its groups side by side); behind fake_endpoint.py batching
    as Export-Deploy 0.5+ (a batch answered with its first request's settings) it says `mixed`."""
    import threading

    from ckpteval.tasks.harness_hook.ckpteval_settings_probe import probe
    from tests.e2e.tasks.fake_endpoint import make_server

    model = served_model("tiny")
    base = model.url.removesuffix("/v1/completions")
    straight = probe({"completions": model.url}, model.model_id)
    assert straight.verdict == "honoured", straight
    assert straight.left_out == []  # every probe request, the stop-word one included, answered alone
    stand_in = make_server(["--port", "0", "--upstream", base, "--batch-window", "0.05"])
    threading.Thread(target=stand_in.serve_forever, args=(0.05,), daemon=True).start()
    try:
        behind = probe({"completions": f"http://127.0.0.1:{stand_in.server_address[1]}/v1/completions"}, model.model_id)
    finally:
        stand_in.shutdown()
        stand_in.server_close()
    assert behind.verdict == "mixed", behind
    assert straight.seconds < 30 and behind.seconds < 30
