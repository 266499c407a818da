"""A local invocation's process: found by pid AND command line, so a reused pid is never taken for the job."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ckpteval.job.invocation import InvocationRecord
from ckpteval.job.manage import cancel, job_process_alive


def _record(job_dir: Path, pid: int | None) -> InvocationRecord:
    return InvocationRecord(
        id="0a1b2c3d",
        created="2026-11-22T00:00:00Z",
        mode="local",
        profile="local",
        executor="local",
        job_dir=str(job_dir),
        tasks=[],
        extra={"pid": pid},
    )


def test_the_jobs_own_process_is_alive_and_cancel_stops_it(tmp_path: Path):
    (tmp_path / "job.sh").write_text("sleep 60\n")
    proc = subprocess.Popen(["bash", str(tmp_path / "job.sh")], start_new_session=True)
    try:
        record = _record(tmp_path, proc.pid)
        assert job_process_alive(record)
        assert "cancelled" in cancel(record)
        assert proc.wait(timeout=30) != 0
        assert not job_process_alive(record)
    finally:
        proc.kill()


def test_a_reused_pid_is_not_the_job(tmp_path: Path):
    (tmp_path / "job.sh").write_text("sleep 60\n")
    # this test's own process stands for an unrelated process that got the job's old pid
    record = _record(tmp_path, os.getpid())
    assert not job_process_alive(record)
    assert cancel(record) == "invocation 0a1b2c3d is not running"  # and nothing was signalled
    assert not job_process_alive(_record(tmp_path, None))
