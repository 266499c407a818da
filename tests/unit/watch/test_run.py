"""A watcher's life through the library (`ckpteval.watch.run`): the lock before the state, stop handling
from the first instant (SIGTERM, the stop file), `request_stop` waiting for the watcher to end, and the
CLI's `watch stop` on a real watcher process. The config is the embedded `tiny` (compiled, nothing run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpteval.errors import ConfigError
from ckpteval.watch.run import health, open_watch, request_stop, watch
from ckpteval.watch.state import WatchSpec, load_state, lock_held, stop_file


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
        deadline = time.monotonic() + 120
        run = None
        while time.monotonic() < deadline and proc.poll() is None:
            states = list((Path(os.environ["XDG_STATE_HOME"]) / "ckpteval" / "watch").glob("*/state.json"))
            if states:
                state = load_state(states[0].parent.name)
                if state is not None and state.polls and state.pid == proc.pid:
                    run = state.run
                    h = health(state)
                    assert h.alive and h.pid == proc.pid and h.next_poll and h.next_poll > time.time()
                    break
            time.sleep(0.2)
        assert run is not None, (tmp_path / "watcher.log").read_text()
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
