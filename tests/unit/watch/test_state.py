"""The watch run's record: a stable name per save dir, atomic round trip, one watcher per run."""

from __future__ import annotations

import pytest

from ckpteval.errors import ConfigError
from ckpteval.watch.state import (
    Attempt,
    IterationEntry,
    RunLock,
    WatchSpec,
    WatchState,
    find_run,
    load_state,
    run_name,
    state_file,
)


def test_the_same_save_dir_is_the_same_run():
    a = run_name("/lustre/run42/checkpoints", "eos")
    assert a == run_name("/lustre/run42/checkpoints/", "eos")
    assert a.startswith("run42-")
    assert a != run_name("/lustre/run42/checkpoints", "other-cluster")
    assert a != run_name("/lustre/run43/checkpoints", "eos")


def test_state_round_trips_and_is_found_by_prefix():
    spec = WatchSpec(save_dir="/s", configs=["tiny"], profile=None, tasks=["hellaswag"], overrides=["a=1"])
    state = WatchState(run="run42-abcdef", spec=spec, created=1.0)
    entry = IterationEntry(10, "/s/iter_0000010", "succeeded", first_seen_ready=2.0, metrics={"t/acc": 0.5})
    entry.attempts.append(Attempt(invocation="deadbeef", submitted_at=3.0, state="succeeded", ended_at=4.0))
    state.iterations[10] = entry
    state.save()
    assert not list(state_file(state.run).parent.glob(".state.json.*"))  # no temp file left behind
    again = load_state("run42-abcdef")
    assert again == state
    assert find_run("run42").run == "run42-abcdef"
    with pytest.raises(ConfigError, match="not a watch run"):
        find_run("nope")


def test_a_damaged_state_file_is_one_clear_error():
    path = state_file("broken-000000")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_state("broken-000000")


def test_two_watchers_of_one_run_are_refused():
    with RunLock("run42-abcdef"), pytest.raises(ConfigError, match="Another watcher"):
        RunLock("run42-abcdef").__enter__()
    with RunLock("run42-abcdef"):  # released with the first
        pass
