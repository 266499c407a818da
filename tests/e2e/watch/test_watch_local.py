"""`evaluate watch` on this machine against a stand-in training (trainer.py) that saves the tiny model as
iter 10, 20 (slowly: seen half-written first), 30 (crashes half-way, never completed) and 40.

The watcher is killed while it evaluates iteration 10 and started again (the same command, `--once`):
exactly 10, 20 and 40 are evaluated, once each, with the real pipeline (the builtin server on the
iteration's own directory, hellaswag on 1 sample); the W&B offline run read back has one point per
iteration at step = iteration. About 2-3 minutes on 2 idle cores (three evaluations, most of it the
harness's and megatron's start-up).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.watch.support import wait_for, watch_state
from tests.support.wandb_offline import offline_run_dirs, read_offline_run

# three evaluations: ~3 min on 2 idle cores, but the harness start-up alone takes minutes on a loaded machine
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

EVALUATE = [sys.executable, "-m", "ckpteval.cli"]
TRAINER = Path(__file__).with_name("trainer.py")
PARAMS = "evaluation.nemo_evaluator_config.config.params"


def test_watch_evaluates_each_complete_checkpoint_once_across_a_restart(isolated_user: Path, tmp_path: Path):
    save_dir = tmp_path / "run42" / "checkpoints"
    go = tmp_path / "go"
    state_dir = Path(os.environ["XDG_STATE_HOME"]) / "ckpteval"
    env = {
        **os.environ,
        "COLUMNS": "200",
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
    }
    trainer_log = tmp_path / "trainer.log"
    with open(trainer_log, "w") as out:
        trainer = subprocess.Popen([sys.executable, str(TRAINER), str(save_dir), str(go)], stdout=out, stderr=out)
    watch = [
        *EVALUATE,
        "watch",
        str(save_dir),
        "-c",
        "tiny",
        "-t",
        "hellaswag",
        "--every",
        "1",
        f"{PARAMS}.limit_samples=1",
        f"{PARAMS}.parallelism=1",
        "export.wandb.enabled=true",
        "export.wandb.project=watch-test",
    ]
    try:
        wait_for("the trainer's half-written iteration 20", lambda: "HALF 20" in trainer_log.read_text(), 600)

        # 1. a watcher sees 10 complete and 20 half-written; it is killed while it evaluates 10
        first_log = tmp_path / "watch1.log"
        with open(first_log, "w") as out:
            first = subprocess.Popen(watch, cwd=isolated_user, env=env, stdout=out, stderr=out)
        state = wait_for(
            "iteration 10 submitted",
            lambda: (s := watch_state(state_dir)) and s["iterations"].get("10", {}).get("state") == "submitted" and s,
            300,
        )
        wait_for("the listing of 20", lambda: "iteration 20: not completely written yet" in first_log.read_text())
        assert set(state["iterations"]) == {"10"}
        first.send_signal(signal.SIGKILL)
        first.wait()

        # 2. the training finishes 20, crashes during 30, goes on to 40
        go.write_text("go")
        wait_for("the trainer", lambda: trainer.poll() is not None, 600)
        assert trainer.returncode == 0, trainer_log.read_text()[-3000:]

        # 3. the same command again, --once: follows 10 (still running or done), evaluates 20 and 40, exits
        second = subprocess.run(
            [*watch, "--once"], cwd=isolated_user, env=env, capture_output=True, text=True, timeout=2000
        )
        assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    finally:
        for proc in (trainer,):
            if proc.poll() is None:
                proc.kill()

    final = watch_state(state_dir)
    assert final is not None
    iterations = final["iterations"]
    assert sorted(iterations, key=int) == ["10", "20", "40"]  # 30 never completed: never evaluated
    for key, entry in iterations.items():
        assert entry["state"] == "succeeded", entry
        assert len(entry["attempts"]) == 1, entry  # once each, the restart included
        assert entry["path"] == str(save_dir / f"iter_{int(key):07d}")

    # exactly three invocations were recorded, each serving its own iteration's directory
    records = [json.loads(p.read_text()) for p in (state_dir / "invocations").glob("*/record.json")]
    served = sorted(r["watch"]["iteration"] for r in records)
    assert served == [10, 20, 40]
    scored: dict[int, float] = {}  # iteration -> the accuracy its invocation measured
    for r in records:
        results = json.loads((Path(r["job_dir"]) / "results.json").read_text())
        assert results["status"] == "succeeded"
        assert "iter_0000030" not in (Path(r["job_dir"]) / "config.yaml").read_text()
        acc = results["tasks"]["hellaswag"]["metrics"]["acc"]
        assert acc["n_samples"] == 1 and acc["value"] in (0.0, 1.0)  # one document: right or wrong
        scored[r["watch"]["iteration"]] = acc["value"]
    # the watch run's score of each iteration is the one its own invocation measured
    assert {int(k): e["metrics"]["hellaswag/acc"] for k, e in iterations.items()} == scored

    # the curves: one W&B run, one point per iteration, step = iteration
    history = []
    for run_dir in offline_run_dirs(state_dir / "watch" / final["run"]):
        run = read_offline_run(run_dir)
        assert run.run_id == f"ckpteval-watch-{final['run']}"
        history.extend(run.history)
    assert [(h["_step"], h["iteration"], h["hellaswag/acc"]) for h in history] == [
        (i, i, scored[i]) for i in (10, 20, 40)
    ]

    shown = subprocess.run(
        [*EVALUATE, "results", "--watch", final["run"], "--json"],
        cwd=isolated_user,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert [row["iteration"] for row in json.loads(shown.stdout)["iterations"]] == [10, 20, 40]
