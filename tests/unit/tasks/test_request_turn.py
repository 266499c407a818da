"""A task client's first request waits for its group's turn (`CKPTEVAL_REQUEST_TURN`), with or without a
deployment to wait for, and nemo-evaluator's capability check waits with it."""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path

import pytest

from ckpteval.tasks.harness_hook import ckpteval_wait_ready as wait_ready

turn = wait_ready._turn  # the module the hook's wait uses


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(wait_ready.HEALTH_ENV, raising=False)  # deployment=none: nothing to be healthy
    monkeypatch.setattr(wait_ready, "_ready", threading.Event())
    monkeypatch.setattr(turn, "_open", threading.Event())
    monkeypatch.setattr(turn, "_POLL_S", 0.05)


def _open_later(path: Path, seconds: float) -> None:
    threading.Timer(seconds, path.write_text, args=("open\n",)).start()


def test_the_first_request_waits_until_its_turn_opens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = tmp_path / "state" / "turn-2"
    monkeypatch.setenv(turn.TURN_ENV, str(gate))
    gate.parent.mkdir()
    assert not turn.turn_is_open()
    _open_later(gate, 0.5)
    start = time.monotonic()
    waited = wait_ready.wait_for_deployment()
    assert 0.4 < waited < 5 and gate.exists() and time.monotonic() - start >= 0.4
    assert wait_ready.wait_for_deployment() == 0.0  # later requests go at once


def test_no_turn_named_no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(turn.TURN_ENV, raising=False)
    assert turn.turn_is_open() and wait_ready.wait_for_deployment() == 0.0


def test_the_capability_check_waits_for_the_turn_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nemo-evaluator's `verify_capabilities` sends a request of its own settings: not before the turn."""
    gate = tmp_path / "turn-1"
    monkeypatch.setenv(turn.TURN_ENV, str(gate))
    probed: list[float] = []
    module = types.ModuleType("nemo_evaluator.core.input")
    module.verify_capabilities = lambda evaluation: probed.append(time.monotonic()) or evaluation  # type: ignore[attr-defined]
    wait_ready.patch_input(module)
    assert module.verify_capabilities("evaluation") is True  # type: ignore[attr-defined]
    time.sleep(0.3)
    assert not probed  # still closed: nothing sent
    opened = time.monotonic()
    gate.write_text("open\n")
    deadline = time.monotonic() + 10
    while not probed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert probed and probed[0] >= opened
