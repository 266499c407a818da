"""`evaluate watch stop RUN --cancel` on this machine, during a real evaluation: the watcher stops, its
evaluation (the job, its builtin server and its task client) is cancelled, and when `stop` returns nothing
they started still runs; the checkpoint is withdrawn, not failed. The stops during start-up and during a
poll are covered in tests/unit/watch/test_run.py (with stand-in evaluations)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.watch.support import wait_for, watch_state
from tests.support.leftovers import MARK, marked_processes

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1200)]

EVALUATE = [sys.executable, "-m", "ckpteval.cli"]
TRAINER = Path(__file__).with_name("trainer.py")
PARAMS = "evaluation.nemo_evaluator_config.config.params"


def test_watch_stop_cancel_during_an_evaluation_leaves_nothing_running(isolated_user: Path, tmp_path: Path):
    save_dir = tmp_path / "run42" / "checkpoints"
    state_dir = Path(os.environ["XDG_STATE_HOME"]) / "ckpteval"
    env = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    trainer_log = tmp_path / "trainer.log"
    with open(trainer_log, "w") as out:  # saves iteration 10 and ends
        trainer = subprocess.Popen(
            [sys.executable, str(TRAINER), "--chaos", str(save_dir), "0", "10"], stdout=out, stderr=out
        )
    watcher = None
    try:
        wait_for("the trainer", lambda: trainer.poll() is not None, 600)
        assert trainer.returncode == 0 and "SAVED 10" in trainer_log.read_text(), trainer_log.read_text()[-3000:]
        log = tmp_path / "watch.log"
        with open(log, "w") as out:
            command = ["watch", str(save_dir), "-c", "tiny", "-t", "hellaswag", "--every", "300", "--follow-every", "1"]
            watcher = subprocess.Popen(
                [*EVALUATE, *command, f"{PARAMS}.limit_samples=1", f"{PARAMS}.parallelism=1"],
                cwd=isolated_user,
                env=env,
                stdout=out,
                stderr=out,
            )

        def running() -> dict | None:
            state = watch_state(state_dir)
            entry = (state or {}).get("iterations", {}).get("10")
            return state if entry and entry["attempts"] and entry["attempts"][-1]["state"] == "running" else None

        state = wait_for("iteration 10's evaluation running", running, 600)
        stop = subprocess.run(
            [*EVALUATE, "watch", "stop", state["run"], "--cancel", "--timeout", "120"],
            cwd=isolated_user,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert "cancelled its evaluations" in stop.stdout and "(iteration 10)" in stop.stdout, stop.stdout
        assert watcher.poll() is not None  # the watcher has ended when `stop` returns...
        left = marked_processes(os.environ[MARK])
        assert not left, "still running when `watch stop --cancel` returned:\n" + "\n".join(left)  # ...and its job
    finally:
        for proc in (trainer, watcher):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    entry = watch_state(state_dir)["iterations"]["10"]  # type: ignore[index]
    assert entry["state"] == "waiting" and [a["state"] for a in entry["attempts"]] == ["withdrawn"], entry
