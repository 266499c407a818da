"""A local invocation's process: found by pid AND start time, so a reused pid is never taken for the job."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ckpteval.api import cancel
from ckpteval.execution.local import LocalProcess, job_process_alive, process_start_time
from ckpteval.invocation.record import InvocationRecord
from tests.support.waiting import wait_until


def _record(job_dir: Path, pid: int | None, started: str | None = None) -> InvocationRecord:
    return InvocationRecord(
        id="0a1b2c3d",
        created="2026-11-22T00:00:00Z",
        mode="local",
        profile="local",
        executor="local",
        job_dir=str(job_dir),
        tasks=[],
        placement=LocalProcess(pid, started or process_start_time(pid)) if pid else None,
    )


def test_the_jobs_own_process_is_alive_and_cancel_stops_it(tmp_path: Path):
    # like a real job script: a trap and more after the command (a lone last command bash would exec)
    (tmp_path / "job.sh").write_text("trap 'exit 143' TERM\ntouch trapped\nsleep 60 &\nwait\nexit 0\n")
    proc = subprocess.Popen(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, start_new_session=True)
    try:
        wait_until(lambda: (tmp_path / "trapped").exists(), timeout=60, what="the script to set its trap")
        record = _record(tmp_path, proc.pid)
        assert job_process_alive(record)
        assert "cancelled" in cancel(record)
        assert proc.wait(timeout=30) != 0
        assert not job_process_alive(record)
    finally:
        proc.kill()


def test_cancel_returns_once_every_process_of_the_job_has_ended(tmp_path: Path, monkeypatch):
    """What a job started outlives its script on SIGTERM (the harness's adapter server runs its hooks first):
    cancel waits for the job's whole process group, and ends what is still there after its grace."""
    from ckpteval.execution import local

    monkeypatch.setattr(local, "CANCEL_GRACE_S", 1.0)
    # the child ignores SIGTERM and outlives the script, as a slow shutdown would
    (tmp_path / "job.sh").write_text("trap 'exit 143' TERM\n(trap '' TERM; sleep 60) &\nwait\nexit 0\n")
    proc = subprocess.Popen(["bash", str(tmp_path / "job.sh")], start_new_session=True)
    try:
        record = _record(tmp_path, proc.pid)
        wait_until(lambda: len(local.process_group_members(proc.pid)) >= 2, timeout=60, what="the job's child process")
        assert "cancelled" in cancel(record)
        assert local.process_group_members(proc.pid) == []  # nothing of the job runs when cancel returns
    finally:
        proc.kill()
        proc.wait()


def test_a_reused_pid_is_not_the_job(tmp_path: Path):
    (tmp_path / "job.sh").write_text("sleep 60\n")
    # this test's own process stands for an unrelated process that got the job's old pid: alive, but it
    # started at another time than the one recorded for the job
    record = _record(tmp_path, os.getpid(), started="1")
    assert not job_process_alive(record)
    assert cancel(record) == "invocation 0a1b2c3d is not running"  # and nothing was signalled
    assert not job_process_alive(_record(tmp_path, None))


def test_a_job_that_ends_while_its_status_is_read_is_not_taken_for_cancelled(tmp_path: Path, monkeypatch):
    """The job writes its exit code, then exits. Read in the other order (state files, then liveness), a job
    that ends in between looked 'not running, no exit code': cancelled, and `evaluate watch` evaluated that
    checkpoint again. Liveness is read first, so the exit code written before the exit is always seen."""
    from ckpteval.execution import local
    from ckpteval.invocation.jobdir import JobDir

    (tmp_path / "state").mkdir()

    def the_job_ends_now(_record: InvocationRecord) -> bool:
        (tmp_path / JobDir.FINISHED).write_text("0\n")  # its last act, then it is gone
        return False

    monkeypatch.setattr(local, "job_process_alive", the_job_ends_now)
    assert local.LocalBackend().attach(_record(tmp_path, None)).state() == "succeeded"


def test_a_handle_attached_from_the_record_reads_the_job_dir_and_cancels_the_job(tmp_path: Path):
    """`LocalBackend.attach(record)` is the job's handle for later commands: its state, a file of its job dir
    (None when absent), its log, and cancel, all from the record alone."""
    from ckpteval.execution.local import LocalBackend
    from ckpteval.invocation.jobdir import JobDir

    (tmp_path / "logs").mkdir()
    (tmp_path / JobDir.JOB_LOG).write_text("one\ntwo\n")
    (tmp_path / "job.sh").write_text("trap 'exit 143' TERM\ntouch trapped\nsleep 60 &\nwait\nexit 0\n")
    proc = subprocess.Popen(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, start_new_session=True)
    try:
        wait_until(lambda: (tmp_path / "trapped").exists(), timeout=60, what="the script to set its trap")
        with LocalBackend().attach(_record(tmp_path, proc.pid)) as job:
            assert job.state() == "pending"  # alive, no task started
            assert job.read("job.sh") == (tmp_path / "job.sh").read_text()
            assert job.read("nothing/here.txt") is None
            assert list(job.logs()) == ["one", "two"]
            assert job.cancel().startswith("cancelled invocation 0a1b2c3d")
            assert proc.wait(timeout=30) == 143
            assert job.state() == "cancelled"  # no exit code recorded, and no longer running
            assert job.cancel() == "invocation 0a1b2c3d is not running"
    finally:
        proc.kill()
        proc.wait()


def test_after_cancel_status_reads_cancelled_and_resume_runs_what_never_started(
    tmp_path: Path, isolated_user: Path, monkeypatch
):
    """A real job script cancelled with `evaluate cancel` while its first task runs: `evaluate status` says the
    deployment and both tasks (the one it stopped, the one it never started) are cancelled; `resume` still
    runs the one that never started (it goes by each task's `.done`, not by what status says)."""
    from typer.testing import CliRunner

    from ckpteval.cli.main import app
    from ckpteval.execution import local
    from ckpteval.execution.local import LocalBackend, LocalJob
    from ckpteval.invocation.record import TaskEntry, load_record
    from tests.unit.job.test_script import free_port, make_plan, pid_written, write_job

    monkeypatch.setattr(local, "CANCEL_GRACE_S", 2.0)  # what outlives the script on a loaded machine: not waited for
    slow = "if [ -f go ]; then true; else echo $$ > a.pid; sleep 60; fi"
    plan = make_plan(tmp_path / "job", port=free_port(), tasks=[("a", slow), ("b", "touch b.ran")])
    write_job(tmp_path, plan)
    job = Path(plan.job_dir)
    record = _record(job, None)
    record.tasks = [TaskEntry(t.name, t.dir) for t in plan.tasks]
    started = LocalJob.start(record)
    try:
        wait_until(lambda: pid_written(job / "a.pid"), timeout=60, what="task a to start")
        cancelled = CliRunner().invoke(app, ["cancel", record.id])
        assert cancelled.exit_code == 0 and "cancelled invocation" in cancelled.output, cancelled.output
        out = CliRunner().invoke(app, ["status", record.id], terminal_width=100).output
        rows = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in out.splitlines() if ln.startswith("│")}
        assert out.splitlines()[0].split()[1] == "cancelled", out
        assert rows == {"deployment": "cancelled", "a": "cancelled", "b": "cancelled"}, out
        assert not (job / "b.ran").exists()

        (job / "go").touch()
        resumed = LocalBackend().resume(load_record(record.id), lambda _event: None)
        assert resumed.proc.wait(timeout=120) == 0
        resumed.close()
        assert (job / "b.ran").exists()  # the task that never started ran
        assert "succeeded" in CliRunner().invoke(app, ["status", record.id]).output.splitlines()[0]
    finally:
        started.proc.kill()
        started.close()
