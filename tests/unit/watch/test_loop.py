"""The watcher's decisions, poll by poll: once per ready checkpoint, bounded retries, max pending,
--policy latest, restarts, and curves exported in iteration order.

The save dir is real (listed with the real command); the pipeline is a stand-in that records what was
submitted and answers states the way `ckpteval.watch.submit` does (the e2e test runs the real one)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ckpteval.cluster.remote import LocalRemote
from ckpteval.errors import ClusterError
from ckpteval.results.model import InvocationResults, Metric, TaskOutcome
from ckpteval.watch.loop import Watcher, WatchEvent
from ckpteval.watch.readiness import list_save_dir
from ckpteval.watch.state import IterationEntry, WatchSpec, WatchState, load_state, stop_file
from ckpteval.watch.submit import EvaluationState


def save(root: Path, iteration: int, *, complete: bool = True) -> None:
    path = root / f"iter_{iteration:07d}"
    path.mkdir(parents=True, exist_ok=True)
    names = ["common.pt", "__0_0.distcp"] + ([".metadata", "metadata.json"] if complete else [])
    for name in names:
        (path / name).write_bytes(b"x")


class Pipeline:
    """Records submissions; each evaluation ends as `outcome(iteration, attempt)` says when `finish` is called."""

    def __init__(self, outcome=lambda iteration, attempt: "succeeded", *, refuse: int = 0) -> None:
        self.outcome = outcome
        self.submitted: list[tuple[int, str]] = []
        self.running: dict[str, int] = {}
        self.ended: dict[str, EvaluationState] = {}
        self.refuse = refuse  # the first N submissions fail (the cluster said no)
        self.cancelled: list[str] = []

    def submit(self, iteration: int, iter_dir: str, invocation: str) -> str:
        assert iter_dir.endswith(f"iter_{iteration:07d}")
        assert invocation not in self.running and invocation not in self.ended  # a fresh id each time
        if self.refuse:
            self.refuse -= 1
            raise ClusterError("sbatch: error: QOSMaxSubmitJobPerUserLimit")
        self.submitted.append((iteration, invocation))
        self.running[invocation] = iteration
        return invocation

    def finish(self) -> None:
        for invocation, iteration in list(self.running.items()):
            attempt = sum(1 for i, _ in self.submitted if i == iteration)
            state = self.outcome(iteration, attempt)
            results = InvocationResults(
                invocation=invocation,
                created="now",
                status=state,
                tasks={"hellaswag": TaskOutcome("hellaswag", state, metrics={"acc": Metric(iteration / 100, 0.01)})},
            )
            self.ended[invocation] = EvaluationState(invocation, state, results=results, detail="task client died")
            del self.running[invocation]

    def adopt(self, iteration: int, iter_dir: str, invocation: str) -> bool:
        return (iteration, invocation) in self.submitted  # the stand-in of its invocation record

    def state(self, invocation: str) -> EvaluationState:
        return self.ended.get(invocation) or EvaluationState(invocation, "running")

    def cancel(self, invocation: str) -> str:
        self.cancelled.append(invocation)
        self.running.pop(invocation, None)
        self.ended[invocation] = EvaluationState(invocation, "cancelled")
        return f"cancelled {invocation}"


def make(
    root: Path, pipeline: Pipeline, *, exported: list | None = None, clock=time.time, **spec_kw
) -> tuple[Watcher, list]:
    spec_kw.setdefault("max_pending", 1)
    spec = WatchSpec(save_dir=str(root), configs=["tiny"], profile=None, tasks=[], overrides=[], **spec_kw)
    state = load_state("run-000000") or WatchState(run="run-000000", spec=spec, created=0.0)
    events: list[WatchEvent] = []

    def exporter(st: WatchState, entries: list[IterationEntry]) -> str:
        assert exported is not None
        exported.extend(e.iteration for e in entries)
        return "exported"

    watcher = Watcher(
        state,
        lister=lambda: list_save_dir(LocalRemote(), str(root)),
        pipeline=pipeline,
        on_event=events.append,
        exporter=exporter if exported is not None else None,
        clock=clock,
    )
    return watcher, events


def test_each_complete_checkpoint_once_and_a_half_written_one_when_complete(tmp_path: Path):
    save(tmp_path, 10)
    save(tmp_path, 20, complete=False)
    pipeline = Pipeline()
    watcher, events = make(tmp_path, pipeline, max_pending=4)
    watcher.poll()
    assert [i for i, _ in pipeline.submitted] == [10]
    assert any(e.kind == "incomplete" and e.iteration == 20 for e in events)
    watcher.poll()
    assert len(pipeline.submitted) == 1  # still running: not submitted again
    save(tmp_path, 20)  # the save completes
    pipeline.finish()
    watcher.poll()
    assert [i for i, _ in pipeline.submitted] == [10, 20]
    pipeline.finish()
    watcher.poll()
    watcher.poll()
    assert [i for i, _ in pipeline.submitted] == [10, 20]
    assert {i: e.state for i, e in watcher.state.iterations.items()} == {10: "succeeded", 20: "succeeded"}
    assert watcher.state.iterations[20].metrics["hellaswag/acc"] == pytest.approx(0.2)


def test_a_restarted_watcher_resubmits_nothing_and_misses_nothing(tmp_path: Path):
    save(tmp_path, 10)
    save(tmp_path, 20)
    pipeline = Pipeline()
    first, _ = make(tmp_path, pipeline, max_pending=1)
    first.poll()  # 10 submitted, 20 waiting for a slot; then the watcher is killed
    del first
    save(tmp_path, 30)
    second, _ = make(tmp_path, pipeline, max_pending=1)
    second.poll()
    assert [i for i, _ in pipeline.submitted] == [10]  # 10 still running: no slot, nothing twice
    pipeline.finish()
    second.poll()
    pipeline.finish()
    second.poll()
    pipeline.finish()
    second.poll()
    assert [i for i, _ in pipeline.submitted] == [10, 20, 30]
    assert all(e.state == "succeeded" for e in load_state("run-000000").iterations.values())  # type: ignore[union-attr]


class Killed(BaseException):
    """SIGKILL, simulated: nothing after it runs (not even `finally` blocks that save the state)."""


KILL_POINTS = [
    "before the intent is saved",
    "after the intent, before the submission",
    "after the submission, before its id is saved",
    "after its id is saved",
]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_watcher_killed_at_any_point_of_a_submission_evaluates_the_checkpoint_once(tmp_path: Path, point: str):
    """The intent (the invocation id the submission will get) is saved before the submission; a restarted
    watcher adopts an intent whose invocation was recorded and submits again only one that never was."""
    save(tmp_path, 10)

    class Killing(Pipeline):
        def submit(self, iteration: int, iter_dir: str, invocation: str) -> str:
            if point == KILL_POINTS[1]:
                raise Killed
            super().submit(iteration, iter_dir, invocation)
            if point == KILL_POINTS[2]:
                raise Killed  # the job runs; the watcher's state still says "submitting"
            return invocation

    pipeline = Killing()
    first, _ = make(tmp_path, pipeline)

    def save_then_maybe_kill(original=first.state.save) -> None:  # type: ignore[no-untyped-def]
        attempts = [a.state for e in first.state.iterations.values() for a in e.attempts]
        if point == KILL_POINTS[0] and "submitting" in attempts:
            raise Killed  # before the intent reaches the disk
        original()
        if point == KILL_POINTS[3] and "submitted" in attempts:
            raise Killed

    first.state.save = save_then_maybe_kill  # type: ignore[method-assign]
    with pytest.raises(Killed):
        first.poll()
    on_disk = load_state("run-000000")
    recorded = [a.state for e in (on_disk.iterations.values() if on_disk else []) for a in e.attempts]
    assert recorded == {0: [], 1: ["submitting"], 2: ["submitting"], 3: ["submitted"]}[KILL_POINTS.index(point)]

    pipeline.__class__ = Pipeline  # the restarted watcher is not killed
    second, events = make(tmp_path, pipeline)
    second.poll()
    pipeline.finish()
    second.poll()
    assert [i for i, _ in pipeline.submitted] == [10]  # once, whatever the point of the kill
    entry = load_state("run-000000").iterations[10]  # type: ignore[union-attr]
    assert entry.state == "succeeded" and [a.invocation for a in entry.attempts] == [pipeline.submitted[0][1]]
    assert any(e.kind == "adopted" for e in events) == (point == KILL_POINTS[2])


def test_failures_are_retried_a_bounded_number_of_times_then_reported(tmp_path: Path):
    save(tmp_path, 10)
    save(tmp_path, 20)
    pipeline = Pipeline(lambda iteration, attempt: "failed" if iteration == 10 or attempt == 1 else "succeeded")
    watcher, events = make(tmp_path, pipeline, max_pending=2, max_attempts=3)
    for _ in range(6):
        watcher.poll()
        pipeline.finish()
    watcher.poll()
    assert [i for i, _ in pipeline.submitted].count(10) == 3
    assert [i for i, _ in pipeline.submitted].count(20) == 2
    assert watcher.state.iterations[10].state == "failed"
    assert "3 attempts failed" in watcher.state.iterations[10].note
    assert watcher.state.iterations[20].state == "succeeded"
    assert [e.iteration for e in events if e.kind == "failed"] == [10]


def test_a_refused_submission_counts_as_an_attempt(tmp_path: Path):
    save(tmp_path, 10)
    pipeline = Pipeline(refuse=1)
    watcher, events = make(tmp_path, pipeline)
    watcher.poll()
    assert watcher.state.iterations[10].state == "retry"
    assert "QOSMaxSubmitJobPerUserLimit" in next(e.message for e in events if e.kind == "retry")
    watcher.poll()
    assert [i for i, _ in pipeline.submitted] == [10]


def test_max_pending_bounds_what_is_in_flight(tmp_path: Path):
    for i in (10, 20, 30, 40, 50):
        save(tmp_path, i)
    pipeline = Pipeline()
    watcher, _ = make(tmp_path, pipeline, max_pending=2)
    watcher.poll()
    watcher.poll()
    assert [i for i, _ in pipeline.submitted] == [10, 20]
    pipeline.finish()
    watcher.poll()
    assert [i for i, _ in pipeline.submitted] == [10, 20, 30, 40]


def test_policy_latest_skips_to_the_newest_and_says_so(tmp_path: Path):
    for i in (10, 20, 30):
        save(tmp_path, i)
    pipeline = Pipeline()
    watcher, events = make(tmp_path, pipeline, policy="latest", max_pending=1)
    watcher.poll()
    assert [i for i, _ in pipeline.submitted] == [30]
    assert {i: e.state for i, e in watcher.state.iterations.items()} == {10: "skipped", 20: "skipped", 30: "submitted"}
    assert sorted(e.iteration for e in events if e.kind == "skipped") == [10, 20]  # type: ignore[type-var]


def test_curves_get_points_in_iteration_order_only(tmp_path: Path):
    save(tmp_path, 10)
    save(tmp_path, 20)
    exported: list[int] = []
    finish_order = {"first": 20}

    class OutOfOrder(Pipeline):
        def finish_one(self, iteration: int) -> None:
            invocation = next(inv for inv, it in self.running.items() if it == iteration)
            keep = {k: v for k, v in self.running.items() if k != invocation}
            self.running = {invocation: iteration}
            self.finish()
            self.running = keep

    pipeline = OutOfOrder()
    watcher, _ = make(tmp_path, pipeline, max_pending=2, exported=exported)
    watcher.poll()
    pipeline.finish_one(finish_order["first"])  # 20 ends before 10
    watcher.poll()
    assert exported == []  # 20 waits for 10: a lower step after a higher one would be dropped
    pipeline.finish_one(10)
    watcher.poll()
    assert exported == [10, 20]
    watcher.poll()
    assert exported == [10, 20]  # never twice
    assert watcher.state.exported_through == 20


def test_once_ends_when_what_was_ready_at_start_is_done(tmp_path: Path):
    save(tmp_path, 10)
    pipeline = Pipeline()
    watcher, _ = make(tmp_path, pipeline, every=0.05)

    def lister():
        listing = list_save_dir(LocalRemote(), str(tmp_path))
        pipeline.finish()
        save(tmp_path, 20)  # appears after the first poll: not part of --once
        return listing

    watcher.lister = lister
    watcher.run(once=True)
    assert [i for i, _ in pipeline.submitted] == [10]


def test_a_stop_asked_during_start_up_is_honoured_and_an_old_one_is_not(tmp_path: Path):
    """`watch stop` writes the stop file while the watcher holds its lock, possibly before its first poll:
    the file is no longer deleted at start-up, so that stop is honoured (no poll at all). A stop file older
    than the watcher (its watcher died before reading it) does not stop the next one."""
    save(tmp_path, 10)
    pipeline = Pipeline()
    watcher, _ = make(tmp_path, pipeline, every=300, follow_every=0.05)
    stop_file("run-000000").parent.mkdir(parents=True, exist_ok=True)
    stop_file("run-000000").write_text(f"{watcher.started - 60}\n")  # left over from an earlier watcher
    pipeline_finishes_at_once = Pipeline.state

    def state(self, invocation):  # type: ignore[no-untyped-def]
        self.finish()
        return pipeline_finishes_at_once(self, invocation)

    pipeline.state = state.__get__(pipeline)  # type: ignore[method-assign]
    assert watcher.run(once=True) == "done" and [i for i, _ in pipeline.submitted] == [10]

    again, _ = make(tmp_path, Pipeline(), every=0.05)
    stop_file("run-000000").write_text(f"{again.started + 0.001}\n")  # asked while it was starting
    assert again.run() == "stopped"
    assert again.state.polls == 1  # the first watcher's one poll: the second made none


def test_once_ends_within_seconds_of_its_last_evaluation(tmp_path: Path):
    """It used to notice a finished evaluation at the next save-dir poll only (--every, 300 s by default):
    the evaluations in flight are followed on their own cadence."""
    save(tmp_path, 10)
    pipeline = Pipeline()
    watcher, _ = make(tmp_path, pipeline, every=300, follow_every=0.05)
    asked = {"n": 0}
    answer = Pipeline.state

    def state(self, invocation):  # type: ignore[no-untyped-def]
        asked["n"] += 1
        if asked["n"] == 3:
            self.finish()  # the evaluation ends between two status queries
        return answer(self, invocation)

    pipeline.state = state.__get__(pipeline)  # type: ignore[method-assign]
    started = time.monotonic()
    assert watcher.run(once=True) == "done"
    assert time.monotonic() - started < 10  # not the 300 s poll interval
    assert watcher.state.polls == 1 and watcher.state.iterations[10].state == "succeeded"


def test_an_evaluation_past_its_deadline_is_cancelled_and_counts_as_a_failed_attempt(tmp_path: Path):
    save(tmp_path, 10)
    now = [1000.0]
    pipeline = Pipeline()  # never finishes by itself
    watcher, events = make(tmp_path, pipeline, clock=lambda: now[0], eval_timeout=600, max_attempts=2)
    watcher.poll()
    now[0] += 599
    watcher.follow()
    assert watcher.state.iterations[10].state == "submitted" and pipeline.cancelled == []
    now[0] += 2
    watcher.follow()  # past its deadline: cancelled, counted, and the second attempt submitted at once
    first = watcher.state.iterations[10].attempts[0]
    assert pipeline.cancelled == [pipeline.submitted[0][1]] and first.state == "cancelled"
    assert "did not finish within 10 min" in (first.error or "")
    assert [i for i, _ in pipeline.submitted] == [10, 10]
    assert any(e.kind == "error" and "given up" in e.message for e in events)
    now[0] += 601
    watcher.follow()
    assert watcher.state.iterations[10].state == "failed"  # bounded: 2 attempts, then reported


def test_status_errors_become_a_reported_failure_after_a_bounded_number_of_queries(tmp_path: Path):
    """A status error used to be swallowed and retried every poll forever (the entry stayed submitted and
    --once never ended)."""
    save(tmp_path, 10)
    pipeline = Pipeline()

    def no_answer(invocation: str) -> EvaluationState:
        raise ClusterError("ssh: connect to host login port 22: Connection refused")

    pipeline.state = no_answer  # type: ignore[method-assign]
    watcher, events = make(tmp_path, pipeline, every=300, follow_every=0.01, status_error_limit=3, max_attempts=1)
    started = time.monotonic()
    assert watcher.run(once=True) == "done"
    assert time.monotonic() - started < 10
    entry = watcher.state.iterations[10]
    assert entry.state == "failed" and "no status after 3 queries in a row" in entry.note
    assert [e.message for e in events if e.kind == "error"][:2] == [
        "iteration 10: status unknown (ssh: connect to host login port 22: Connection refused); query 1 of 3 in a row",
        "iteration 10: status unknown (ssh: connect to host login port 22: Connection refused); query 2 of 3 in a row",
    ]
    assert pipeline.cancelled == [pipeline.submitted[0][1]]
    assert "Connection refused" in (watcher.state.last_error or "") and watcher.state.errors


def test_a_listing_that_fails_after_the_first_is_reported_and_polling_goes_on(tmp_path: Path):
    save(tmp_path, 10)
    watcher, events = make(tmp_path, Pipeline())
    watcher.poll()
    good = watcher.lister

    def broken():  # type: ignore[no-untyped-def]
        raise ClusterError("ssh: Connection timed out")

    watcher.lister = broken
    assert watcher.poll().listing is None
    assert any("listing the save dir failed" in e.message for e in events if e.kind == "error")
    watcher.lister = good
    assert watcher.poll().listing is not None and watcher.state.polls == 3


def test_an_iteration_a_restarted_training_rewrites_is_evaluated_again_and_both_stay_on_the_curve(tmp_path: Path):
    import os

    from ckpteval.watch.curves import curve_rows

    save(tmp_path, 10)
    pipeline = Pipeline()
    watcher, events = make(tmp_path, pipeline)
    watcher.poll()
    pipeline.finish()
    watcher.poll()
    watcher.poll()
    assert [i for i, _ in pipeline.submitted] == [10]  # evaluated once, not again while nothing changes
    later = time.time() + 5  # the training restarted from iteration 0 and saved iter_10 again
    for name in ("common.pt", ".metadata", "metadata.json"):
        os.utime(tmp_path / "iter_0000010" / name, (later, later))
    watcher.poll()
    assert [i for i, _ in pipeline.submitted] == [10, 10]
    assert any(e.kind == "rewritten" and e.iteration == 10 for e in events)
    pipeline.finish()
    watcher.poll()
    rows = curve_rows(watcher.state)
    assert [(r["iteration"], r["state"]) for r in rows] == [(10, "succeeded (saved again since)"), (10, "succeeded")]
    assert rows[0]["invocation"] != rows[1]["invocation"]
    assert load_state("run-000000") is not None and len(load_state("run-000000").rewritten) == 1  # survives restarts
