"""A watcher's life through the library (`ckpteval.watch.run`): the lock before the state, stop handling
from the first instant (SIGTERM, the stop file), `request_stop` waiting for the watcher to end, and the
CLI's `watch stop` on a real watcher process. The config is the embedded `tiny` (compiled, nothing run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ckpteval.errors import ConfigError
from ckpteval.watch.run import health, open_watch, request_stop, watch
from ckpteval.watch.state import WatchSpec, load_state, lock_held, stop_file
from tests.support.waiting import wait_until


def _spec(root: Path, **kw) -> WatchSpec:  # type: ignore[no-untyped-def]
    return WatchSpec(save_dir=str(root), configs=["tiny"], profile=None, tasks=["hellaswag"], overrides=[], **kw)


def test_the_lock_is_taken_before_the_state_is_read_and_a_second_watcher_is_refused(tmp_path: Path):
    first = open_watch(_spec(tmp_path / "checkpoints"))
    try:
        assert lock_held(first.state.run)
        with pytest.raises(ConfigError, match="Another watcher is running watch run"):
            open_watch(_spec(tmp_path / "checkpoints"))  # refused before it reads (or could write) the state
    finally:
        first.close()
    assert not lock_held(first.state.run)
    again = open_watch(_spec(tmp_path / "checkpoints"))
    again.close()
    assert again.state.spec.eval_timeout == 4 * 3600  # every evaluation has a deadline, here 4 h by default


def test_sigterm_during_start_up_stops_the_watcher_before_its_first_poll(tmp_path: Path):
    before = signal.getsignal(signal.SIGTERM)
    outcome = watch(_spec(tmp_path / "checkpoints"), on_start=lambda _w: os.kill(os.getpid(), signal.SIGTERM))
    assert outcome.ended == "stopped" and outcome.exit_status == 0
    state = load_state(outcome.run)
    assert state is not None and state.polls == 0 and state.pid is None
    assert not lock_held(outcome.run)
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_stop_requested_during_start_up_is_honoured_and_the_stopper_says_it_is_not_done_yet(tmp_path: Path):
    """`watch stop` used to answer "stopped" after 10 s whatever happened, and the stop file it wrote was
    deleted by a watcher still starting."""
    asked = []

    def stop_now(watcher) -> None:  # type: ignore[no-untyped-def]
        # the watcher holds its lock and is recorded, but has not polled yet; it is busy here for 0.3 s
        asked.append(request_stop(watcher.state.run, timeout=0.3))

    outcome = watch(_spec(tmp_path / "checkpoints"), on_start=stop_now)
    [result] = asked
    assert not result.stopped and "still runs after 0.3 s" in result.message
    assert outcome.ended == "stopped" and load_state(outcome.run).polls == 0  # type: ignore[union-attr]
    assert not stop_file(outcome.run).exists()  # honoured, so not left for the next watcher
    later = request_stop(outcome.run, timeout=1)
    assert later.stopped and "no watcher" in later.message


def test_watch_stop_waits_for_a_running_watcher_to_end(tmp_path: Path):
    save_dir = tmp_path / "checkpoints"
    log = (tmp_path / "watcher.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckpteval.cli", "watch", str(save_dir), "-c", "tiny", "--every", "300"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:

        def polled():  # type: ignore[no-untyped-def]
            states = list((Path(os.environ["XDG_STATE_HOME"]) / "ckpteval" / "watch").glob("*/state.json"))
            state = load_state(states[0].parent.name) if states else None
            return state if state is not None and state.polls and state.pid == proc.pid else None

        state = wait_until(
            polled,
            timeout=300,
            what="the watcher's first poll",
            interval=0.2,
            unless=lambda: proc.poll() is not None,
            context=lambda: (tmp_path / "watcher.log").read_text(),
        )
        run = state.run
        h = health(state)
        assert h.alive and h.pid == proc.pid and h.next_poll and h.next_poll > time.time()
        result = request_stop(run, timeout=60)
        assert result.stopped and f"process {proc.pid}" in result.message
        assert proc.poll() == 0  # it has exited when `stop` says so, with the status of a stop
        assert "done" not in (tmp_path / "watcher.log").read_text().splitlines()[-1]
        assert not health(load_state(run)).alive  # type: ignore[arg-type]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()


def test_health_flags_a_live_watcher_whose_poll_is_overdue():
    """A watcher that is alive but stopped polling (stuck somewhere) is shown as such, not as 'watching'."""
    import socket

    from ckpteval.execution.local import process_start_time
    from ckpteval.watch.state import WatchState

    now = time.time()
    state = WatchState(run="r", spec=_spec(Path("/s"), every=300, follow_every=5), created=0.0)
    state.pid, state.pid_start, state.host = os.getpid(), process_start_time(os.getpid()), socket.gethostname()
    state.next_poll = now + 10
    assert health(state, now=now).alive and not health(state, now=now).overdue
    assert health(state, now=now + 10 + 61).overdue  # a minute past its next poll
    state.pid_start = "1"  # the pid now belongs to another process: no watcher
    assert not health(state, now=now).alive and not health(state, now=now + 1000).overdue


class FakeEvaluations:
    """The evaluations of the `watch stop --cancel` tests: in place of `SubmitPipeline` (the watcher's and
    the stopper's instances share them); an evaluation runs until it is cancelled. The real pipeline's
    cancel is covered by tests/e2e/watch/test_watch_stop.py."""

    def __init__(self, on_submit=lambda: None) -> None:  # type: ignore[no-untyped-def]
        self.running: dict[str, int] = {}
        self.cancelled: list[str] = []
        self.on_submit = on_submit
        outer = self

        class Pipeline:
            def __init__(self, spec: WatchSpec, run: str, **_options: object) -> None:  # kept=, on_event=
                pass

            def submit(self, iteration: int, iter_dir: str, invocation: str) -> str:
                outer.running[invocation] = iteration
                outer.on_submit()
                return invocation

            def adopt(self, iteration: int, iter_dir: str, invocation: str) -> bool:
                return invocation in outer.running or invocation in outer.cancelled

            def state(self, invocation: str):  # type: ignore[no-untyped-def]
                from ckpteval.watch.submit import EvaluationState

                return EvaluationState(invocation, "cancelled" if invocation in outer.cancelled else "running")

            def cancel(self, invocation: str) -> str:
                outer.running.pop(invocation, None)
                outer.cancelled.append(invocation)
                return "cancelled"

        self.pipeline = Pipeline


def _ready(save_dir: Path, iteration: int) -> None:
    path = save_dir / f"iter_{iteration:07d}"
    path.mkdir(parents=True)
    for name in ("common.pt", ".metadata", "metadata.json"):
        (path / name).write_bytes(b"x")


def _stop_in_thread(run: str, results: list) -> threading.Thread:  # type: ignore[type-arg]
    thread = threading.Thread(target=lambda: results.append(request_stop(run, timeout=30, cancel=True)))
    thread.start()
    return thread


@pytest.mark.parametrize("when", ["start-up", "poll", "evaluation"])
def test_watch_stop_cancel_is_honoured_at_any_moment_and_withdraws_what_is_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
):
    """Asked during start-up (before the first poll), during a poll (while the watcher submits) or during an
    evaluation (the watcher following it): the watcher stops, its evaluation in flight is cancelled and
    waited for, and is withdrawn, not a failed attempt (the next watcher evaluates the checkpoint again)."""
    save_dir = tmp_path / "checkpoints"
    _ready(save_dir, 10)
    stops: list = []  # type: ignore[type-arg]
    threads: list[threading.Thread] = []
    run_of = lambda: load_state_run(save_dir)  # noqa: E731

    def stop_now() -> None:
        threads.append(_stop_in_thread(run_of(), stops))
        # the stop is asked (its file written) while this poll is still going on
        wait_until(lambda: stop_file(run_of()).exists(), timeout=60, what="the stop file", interval=0.01)

    evaluations = FakeEvaluations(on_submit=stop_now if when == "poll" else lambda: None)
    monkeypatch.setattr(sys.modules["ckpteval.watch.run"], "SubmitPipeline", evaluations.pipeline)

    def on_start(watcher) -> None:  # type: ignore[no-untyped-def]
        if when == "start-up":
            stop_now()
        elif when == "evaluation":

            def when_running() -> None:
                wait_until(lambda: evaluations.running, timeout=60, what="an evaluation in flight", interval=0.05)
                stops.append(request_stop(watcher.state.run, timeout=30, cancel=True))

            threads.append(threading.Thread(target=when_running))
            threads[-1].start()

    outcome = watch(_spec(save_dir, every=1, follow_every=0.5), on_start=on_start)
    for thread in threads:
        thread.join(60)
    [result] = stops
    assert outcome.ended == "stopped" and result.stopped, result.message
    assert not evaluations.running  # nothing left running
    state = load_state(outcome.run)
    assert state is not None and not lock_held(outcome.run)
    if when == "start-up":
        assert state.polls == 0 and not evaluations.cancelled and "none in flight" in result.message
        return
    [invocation] = evaluations.cancelled
    assert f"cancelled its evaluations: {invocation} (iteration 10)" in result.message
    entry = state.iterations[10]
    assert entry.state == "waiting" and [a.state for a in entry.attempts] == ["withdrawn"]

    # the next watcher evaluates 10 again, as its first attempt
    again = FakeEvaluations()
    monkeypatch.setattr(sys.modules["ckpteval.watch.run"], "SubmitPipeline", again.pipeline)
    watcher = open_watch(_spec(save_dir, every=1))
    try:
        watcher.poll()
    finally:
        watcher.close()
    assert list(again.running.values()) == [10]
    assert watcher.state.iterations[10].state == "submitted"


def test_watch_stop_cancel_with_no_watcher_running_withdraws_what_a_killed_one_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A watcher killed mid-submission leaves an intent: one never submitted is dropped, one submitted is
    cancelled like any evaluation in flight."""
    from ckpteval.watch.state import Attempt, IterationEntry

    save_dir = tmp_path / "checkpoints"
    evaluations = FakeEvaluations()
    monkeypatch.setattr(sys.modules["ckpteval.watch.run"], "SubmitPipeline", evaluations.pipeline)
    watcher = open_watch(_spec(save_dir, max_pending=3))
    state = watcher.state
    for iteration, invocation, recorded in ((10, "a0", True), (20, "b0", False), (30, "c0", True)):
        attempt = Attempt(invocation, time.time(), state="submitting" if iteration < 30 else "submitted")
        state.iterations[iteration] = IterationEntry(iteration, f"/x/{iteration}", "submitted", 0.0, [attempt])
        if recorded:
            evaluations.running[invocation] = iteration
    state.save()
    watcher.close()

    result = request_stop(state.run, timeout=10, cancel=True)
    assert result.stopped and "no watcher" in result.message, result.message
    assert sorted(evaluations.cancelled) == ["a0", "c0"] and not evaluations.running
    after = load_state(state.run)
    assert after is not None
    assert {i: (e.state, [a.state for a in e.attempts]) for i, e in after.iterations.items()} == {
        10: ("waiting", ["withdrawn"]),
        20: ("waiting", []),
        30: ("waiting", ["withdrawn"]),
    }


def load_state_run(save_dir: Path) -> str:
    from ckpteval.watch.state import run_name

    return run_name(str(save_dir), None)
