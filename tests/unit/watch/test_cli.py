"""`evaluate watch` and `evaluate results --watch` from the command line: bad input, status, dry run."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.watch.state import IterationEntry, WatchSpec, WatchState, run_name
from tests.unit.watch.test_loop import save

runner = CliRunner()


def test_bad_input_is_one_clear_line():
    for args, text in (
        (["watch"], "Name the save directory"),
        (["watch", "/x", "-c", "tiny", "--policy", "newest"], "--policy is all or latest"),
        (["watch", "/x", "-c", "tiny", "--max-pending", "0"], "--max-pending must be at least 1"),
        (["watch", "stop"], "takes one watch run"),
        (["watch", "status", "nope"], "not a watch run"),
        (["results", "--watch", "nope"], "not a watch run"),
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert text in result.output, (args, result.output)
        assert "Traceback" not in result.output


def test_dry_run_lists_what_it_would_evaluate_and_the_job(tmp_path: Path):
    root = tmp_path / "checkpoints"
    save(root, 10)
    save(root, 20, complete=False)
    (root / "tokenizer").mkdir()
    result = runner.invoke(app, ["watch", str(root), "-c", "tiny", "-t", "gsm8k", "--dry-run"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "iteration        10  ready: would evaluate now" in out
    assert "iteration        20  incomplete (missing .metadata, metadata.json)" in out
    assert f"model: {root}/iter_0000010" in out
    assert "job script" in out
    assert not (Path.cwd() / "results").exists()  # nothing written


def test_status_and_results_of_a_recorded_run(tmp_path: Path):
    run = run_name("/s/run42/checkpoints", None)
    spec = WatchSpec(save_dir="/s/run42/checkpoints", configs=["tiny"], profile=None, tasks=[], overrides=[])
    state = WatchState(run=run, spec=spec, created=0.0)
    state.iterations[10] = IterationEntry(10, "/s/iter_0000010", "succeeded", 0.0, metrics={"t/acc": 0.5})
    state.iterations[20] = IterationEntry(20, "/s/iter_0000020", "failed", 0.0, note="3 attempts failed; last: boom")
    state.save()
    listing = runner.invoke(app, ["watch", "status"])
    assert listing.exit_code == 0 and run in listing.output
    one = runner.invoke(app, ["watch", "status", "run42"])
    assert one.exit_code == 0 and "3 attempts failed" in one.output and "not running" in one.output
    stop = runner.invoke(app, ["watch", "stop", "run42"])
    assert stop.exit_code == 0 and "nothing to stop" in stop.output
    plot = tmp_path / "c.png"
    shown = runner.invoke(app, ["results", "--watch", "run42", "--plot", str(plot)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "0.5000" in shown.output and "failed" in shown.output
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_status_shows_the_watchers_health_in_flight_errors_and_verdicts():
    import os
    import re
    import socket
    import time

    from ckpteval.execution.local import process_start_time
    from ckpteval.watch.state import Attempt

    run = run_name("/s/run43/checkpoints", None)
    spec = WatchSpec(save_dir="/s/run43/checkpoints", configs=["tiny"], profile=None, tasks=[], overrides=[])
    now = time.time()
    # this test's process stands for the watcher: alive, with its start time
    state = WatchState(run=run, spec=spec, created=0.0, pid=os.getpid(), pid_start=process_start_time(os.getpid()))
    state.last_poll, state.next_poll, state.watcher_since = now - 40, now + 260, now - 3600
    state.host, state.polls = socket.gethostname(), 112
    entry = IterationEntry(30, "/s/iter_0000030", "submitted", 0.0, attempts=[Attempt("5d2e9a1c", now - 750)])
    entry.attempts[0].state, entry.attempts[0].status_errors = "running", 2
    state.iterations[30] = entry
    row = {"task": "t", "metric": "acc", "against": 10, "delta": 0.0, "ci_low": -0.04, "ci_high": 0.04}
    row |= {"mde": 0.063, "n": 1000, "verdict": "no detectable difference", "tested": True, "note": ""}
    state.iterations[20] = IterationEntry(20, "/s/iter_0000020", "succeeded", 0.0, verdicts={"best": [row]})
    state.note_error("iteration 30: status unknown (ssh: timeout); query 2 of 20 in a row", at=now - 5)
    state.save()
    out = runner.invoke(app, ["watch", "status", "run43"], env={"COLUMNS": "200"}).output
    assert f"watching (process {os.getpid()} on {socket.gethostname()}, since" in out
    assert re.search(r"112 polls, last 4\d s ago, next in 2[56]\d s", out), out
    in_flight = r"in flight: iteration 30, 5d2e9a1c \(running, for 1[23]\.\d min, 2 status error\(s\) in a row\)"
    assert re.search(in_flight, out), out
    assert "status unknown (ssh: timeout)" in out
    assert "iteration 20 vs best: t acc +0 [-0.04, +0.04] vs iteration 10: no detectable difference" in out
    assert "(detectable: ±0.063 at n=1000)" in out
