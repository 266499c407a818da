"""The job-directory layout is defined once (`JobDir`), and the job script writes what the readers read."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ckpteval.execution.snapshot import LocalJobView, take_snapshot
from ckpteval.invocation.jobdir import JobDir
from ckpteval.job.plan import DeploymentPlan, JobPlan, Step, TaskPlan, TaskRun
from ckpteval.job.script import render_job_script

SRC = Path(__file__).resolve().parents[3] / "src" / "ckpteval"


def test_the_job_script_writes_the_files_the_readers_look_for(tmp_path: Path):
    task = TaskPlan(
        name="a", dir_name="a", endpoint_url="", runs=(TaskRun(run_config={}, step=Step(command="echo hi")),)
    )
    plan = JobPlan(
        invocation="0a0a0a0a",
        job_dir=str(tmp_path),
        deployment=DeploymentPlan(kind="none", step=None, health_url=None, readiness_timeout=1),
        tasks=(task,),
    )
    (tmp_path / JobDir.SCRIPT).write_text(render_job_script(plan, launcher="processes"))
    (tmp_path / task.dir).mkdir(parents=True)
    subprocess.run(["bash", JobDir.SCRIPT], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    snapshot = take_snapshot(LocalJobView(tmp_path), [(task.name, task.dir)], None)
    assert snapshot.finished == 0 and snapshot.tasks[0].state == "succeeded"
    job_dir = JobDir(str(tmp_path))
    for rel in (JobDir.STARTED, JobDir.FINISHED, JobDir.task_state(task.dir), JobDir.task_done(task.dir)):
        assert job_dir.path(rel).is_file(), rel
    assert job_dir.path(JobDir.task_logs(task.dir, 0)[0]).read_text() == "hi\n"


def test_no_job_dir_path_is_spelled_outside_the_layout_and_the_script():
    spelled = re.compile(
        r"""["'/](logs/job\.log|logs/deployment\.log|state/finished|state/deployment|results\.json)["']"""
    )
    allowed = {SRC / "invocation" / "jobdir.py", SRC / "job" / "script.py"}
    offenders = [
        f"{path.relative_to(SRC)}:{n}"
        for path in SRC.rglob("*.py")
        if path not in allowed
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    assert offenders == []
