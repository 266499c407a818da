"""`evaluate watch` on this machine keeps one deployment across a training's checkpoints and loads each into it
in place: three saves of one run (different weights, written by megatron-core: tests/support/corpus/
training_run.py) are evaluated by one builtin server, each as its own invocation with its own provenance, and
score exactly what three fresh deployments (`--fresh-deployments`, today's watch) score on the same saves.

Both watchers run side by side in time (kept, then fresh), so the wall time per checkpoint of each is measured
under the same load: the numbers, the ratio and the load average are printed (benchmarks/watch.md records a run).
About 4-6 minutes on 2 busy cores (six evaluations, most of it the harness's start-up).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.corpus.training_run import build_training_run

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]

EVALUATE = [sys.executable, "-m", "ckpteval.cli"]
PARAMS = "evaluation.nemo_evaluator_config.config.params"


def _watch(
    save_dir: Path, cwd: Path, env: dict[str, str], *extra: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    command = [
        *EVALUATE,
        "watch",
        str(save_dir),
        "-c",
        "tiny",
        "-t",
        "hellaswag",
        "--once",
        "--every",
        "1",
        *extra,
        f"{PARAMS}.limit_samples=4",
        f"{PARAMS}.parallelism=1",
    ]
    started = time.monotonic()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=3000)
    return done, time.monotonic() - started


def _invocations(state_dir: Path, save_dir: Path) -> dict[int, dict]:
    """iteration -> results.json of the invocations that evaluated `save_dir`'s saves."""
    out = {}
    for path in (state_dir / "invocations").glob("*/record.json"):
        record = json.loads(path.read_text())
        watch = record.get("watch") or {}
        if str(watch.get("iter_dir", "")).startswith(str(save_dir)):
            out[watch["iteration"]] = json.loads((Path(record["job_dir"]) / "results.json").read_text())
    return out


def test_watch_loads_each_checkpoint_into_one_deployment_and_scores_as_fresh_deployments(
    isolated_user: Path, tmp_path: Path
) -> None:
    kept_dir = build_training_run(tmp_path / "kept" / "checkpoints", steps=3)
    fresh_dir = Path(shutil.copytree(kept_dir, tmp_path / "fresh" / "checkpoints"))
    state_dir = Path(os.environ["XDG_STATE_HOME"]) / "ckpteval"
    env = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

    dry = subprocess.run(
        [*EVALUATE, "watch", str(kept_dir), "-c", "tiny", "-t", "hellaswag", "--dry-run"],
        cwd=isolated_user, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "one deployment kept across checkpoints, each loaded into it in place" in dry.stdout
    assert "--load-into" in dry.stdout  # the job of the first loads into the kept server

    kept, kept_wall = _watch(kept_dir, isolated_user, env)
    assert kept.returncode == 0, kept.stdout[-4000:] + kept.stderr[-4000:]
    assert "started the kept deployment" in kept.stdout
    fresh, fresh_wall = _watch(fresh_dir, isolated_user, env, "--fresh-deployments")
    assert fresh.returncode == 0, fresh.stdout[-4000:] + fresh.stderr[-4000:]
    assert "a fresh deployment per checkpoint: --fresh-deployments" in fresh.stdout

    in_place, fresh_runs = _invocations(state_dir, kept_dir), _invocations(state_dir, fresh_dir)
    assert sorted(in_place) == sorted(fresh_runs) == [1, 2, 3]
    contents = set()
    for iteration in (1, 2, 3):
        a, b = in_place[iteration], fresh_runs[iteration]
        assert a["status"] == b["status"] == "succeeded"
        served, planned = a["provenance"]["checkpoint"], b["provenance"]["checkpoint"]
        # each invocation names the checkpoint it was scored on, as the server reported it, verified
        assert served["source"] == "server" and served["verified"] and not served.get("mismatch")
        assert served["path"].endswith(f"iter_000000{iteration}") and served["in_place"] is True
        assert planned["in_place"] is False and served["content"]["sha256"] == planned["content"]["sha256"]
        contents.add(served["content"]["sha256"])
        # scored alike: the same metrics, and the same answers, sample by sample
        assert a["tasks"]["hellaswag"]["metrics"] == b["tasks"]["hellaswag"]["metrics"]
        assert a["usage"]["deployment"] == "kept" and b["usage"]["deployment"] == "own"
        assert a["usage"]["gpus"] == b["usage"]["gpus"] == 0 and a["usage"]["cpu_seconds"] > 0
    assert len(contents) == 3

    per_kept = [in_place[i]["usage"]["wall_seconds"] for i in (1, 2, 3)]
    per_fresh = [fresh_runs[i]["usage"]["wall_seconds"] for i in (1, 2, 3)]
    startup_kept = [in_place[i]["usage"]["phases"]["startup"] for i in (1, 2, 3)]
    startup_fresh = [fresh_runs[i]["usage"]["phases"]["startup"] for i in (1, 2, 3)]
    load = os.getloadavg()
    print(
        f"\nwall per checkpoint (job), kept: {per_kept}, fresh: {per_fresh}; "
        f"start-up kept: {startup_kept}, fresh: {startup_fresh}; "
        f"watcher wall kept {kept_wall:.0f} s, fresh {fresh_wall:.0f} s "
        f"(ratio {kept_wall / fresh_wall:.2f}); load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    # the second and third checkpoints skip the server's start: their start-up is the load in place
    assert sum(startup_kept[1:]) < sum(startup_fresh[1:])
