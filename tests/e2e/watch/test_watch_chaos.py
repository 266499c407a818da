"""Chaos: a stand-in training (trainer.py --chaos) saves iterations 10..60 over a couple of minutes (20 and
50 seen half-written first, 40 crashed half-way and never completed) while the watcher is SIGKILLed at
random moments 3 times and started again (the same command; the last time `--once`, after the training
ended), with a busy process loading the machine. Every complete checkpoint is evaluated exactly once
(one invocation each, the real pipeline: the builtin server on the iteration's directory, hellaswag on 1
sample), 40 never; the last watcher ends by itself; the W&B offline run holds exactly the complete
iterations at step = iteration; nothing they started still runs.

The kill moments come from a seeded RNG (`CKPTEVAL_CHAOS_SEED` to replay one), printed in every failure
message with the kills and the load average. Five evaluations, one at a time: 17-20 minutes a run on 2
shared cores at load average 9-15 (an evaluation of one hellaswag sample took 2.5-3 minutes there, most
of it the server's and the harness's start-up), so it is `long` (3 runs in a row: `pytest -m long
tests/e2e/watch/test_watch_chaos.py`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.watch.support import wait_for, watch_state
from tests.support.leftovers import MARK, marked_processes
from tests.support.wandb_offline import offline_run_dirs, read_offline_run

pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(3600)]

EVALUATE = [sys.executable, "-m", "ckpteval.cli"]
TRAINER = Path(__file__).with_name("trainer.py")
PARAMS = "evaluation.nemo_evaluator_config.config.params"
COMPLETE = [10, 20, 30, 50, 60]
GAP_S = 20.0  # between two saves of the stand-in training
KILLS = 3
LOAD_S = 1800  # the busy process ends by itself after this, whatever happens to the test


def _where(state_dir: Path) -> str:
    """What the watch state says now, in a few words (for the kill log)."""
    state = watch_state(state_dir)
    if state is None:
        return "no state yet"
    return ", ".join(
        f"{i}:{e['state']}" + "".join(f"/{a['state']}" for a in e["attempts"]) for i, e in state["iterations"].items()
    )


@pytest.mark.parametrize("round_", [1, 2, 3])
def test_a_watcher_killed_three_times_on_a_loaded_machine_evaluates_each_complete_checkpoint_once(
    isolated_user: Path, tmp_path: Path, round_: int
):
    seed = int(os.environ.get("CKPTEVAL_CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    rng = random.Random(seed)
    kills: list[str] = []
    loads: list[float] = []

    def context() -> str:
        return f"round {round_}, seed {seed}; kills: {'; '.join(kills) or 'none yet'}; load average {loads}"

    save_dir = tmp_path / "run42" / "checkpoints"
    state_dir = Path(os.environ["XDG_STATE_HOME"]) / "ckpteval"
    env = {
        **os.environ,
        "COLUMNS": "200",
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
    }
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
        "--follow-every",
        "1",
        f"{PARAMS}.limit_samples=1",
        f"{PARAMS}.parallelism=1",
        "export.wandb.enabled=true",
        "export.wandb.project=watch-chaos",
    ]
    busy = subprocess.Popen(
        [sys.executable, "-c", f"import time\nend = time.monotonic() + {LOAD_S}\nwhile time.monotonic() < end: pass"]
    )
    trainer_log = tmp_path / "trainer.log"
    with open(trainer_log, "w") as out:
        trainer = subprocess.Popen(
            [sys.executable, str(TRAINER), "--chaos", str(save_dir), str(GAP_S)], stdout=out, stderr=out
        )
    watcher: subprocess.Popen[bytes] | None = None
    started = time.monotonic()
    try:
        wait_for("the trainer's iteration 10", lambda: "SAVED 10" in trainer_log.read_text(), 600, context())
        # 1. three watchers, each SIGKILLed at a random moment of its life (starting, polling, evaluating)
        for k in range(KILLS):
            delay = rng.uniform(1.0, 120.0)  # start-up, polls, submissions, evaluations
            with open(tmp_path / f"watch{k}.log", "w") as out:
                watcher = subprocess.Popen(watch, cwd=isolated_user, env=env, stdout=out, stderr=out)
            try:
                watcher.wait(timeout=delay)
                raise AssertionError(f"watcher {k} ended by itself: {(tmp_path / f'watch{k}.log').read_text()[-3000:]}")
            except subprocess.TimeoutExpired:
                pass
            watcher.send_signal(signal.SIGKILL)
            watcher.wait()
            loads.append(round(os.getloadavg()[0], 2))
            kills.append(f"{k + 1} at {delay:.1f} s ({_where(state_dir)})")

        # 2. the training ends; the same command, --once: it follows what was in flight, evaluates the rest
        wait_for("the trainer", lambda: trainer.poll() is not None, 900, context())
        assert trainer.returncode == 0, trainer_log.read_text()[-3000:]
        final = subprocess.run(
            [*watch, "--once"], cwd=isolated_user, env=env, capture_output=True, text=True, timeout=2400
        )
        loads.append(round(os.getloadavg()[0], 2))
        assert final.returncode == 0, f"{context()}\n{final.stdout[-4000:]}{final.stderr[-4000:]}"
    finally:
        for proc in (watcher, trainer, busy):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    took = time.monotonic() - started
    print(f"chaos {context()}; {took:.0f} s")

    state = watch_state(state_dir)
    assert state is not None, context()
    iterations = {int(k): e for k, e in state["iterations"].items()}
    assert sorted(iterations) == COMPLETE, context()  # 40 never completed: never evaluated
    for iteration, entry in iterations.items():
        assert entry["state"] == "succeeded", f"{context()}: {entry}"
        assert len(entry["attempts"]) == 1, f"{context()}: iteration {iteration} evaluated twice: {entry}"

    # one invocation per complete iteration, whatever the kills interrupted, each one its own iteration's
    records = [json.loads(p.read_text()) for p in (state_dir / "invocations").glob("*/record.json")]
    served = sorted(r["watch"]["iteration"] for r in records)
    assert served == COMPLETE, context()
    scored: dict[int, float] = {}
    for r in records:
        results = json.loads((Path(r["job_dir"]) / "results.json").read_text())
        assert results["status"] == "succeeded", context()
        scored[r["watch"]["iteration"]] = results["tasks"]["hellaswag"]["metrics"]["acc"]["value"]
    assert {i: e["metrics"]["hellaswag/acc"] for i, e in iterations.items()} == scored, context()

    # W&B: exactly the complete iterations, step = iteration (a watcher killed after it logged a point and
    # before it saved that it had may log it again: W&B keeps the first of a step, so that is no harm)
    history = []
    for run_dir in offline_run_dirs(state_dir / "watch" / state["run"]):
        if list(run_dir.glob("run-*.wandb")):
            history.extend(read_offline_run(run_dir).history)
    assert sorted({h["_step"] for h in history}) == COMPLETE, f"{context()}: {history}"
    assert all(h["iteration"] == h["_step"] and h["hellaswag/acc"] == scored[h["_step"]] for h in history), context()

    # the last watcher ended, and so did every job, server and client the watchers started
    mark = os.environ[MARK]
    wait_for("every process to end", lambda: not marked_processes(mark), 60, context())
