"""The job script's export step (vLLM/SGLang on a Megatron checkpoint), run for real: it runs to its end before
the deployment starts; its notes reach the job's log; when it fails (a parity mismatch: one `error:` line
naming what differs) the job stops with exit 3, saying so, and the engine is never started."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ckpteval.job.plan import Step
from tests.unit.job.test_script import free_port, make_plan, run_job, state, write_job

REFUSAL = (
    "echo 'export: hashing /ckpt/iter_0000100 (its content identity keys the export cache)'; "
    "echo 'error: /cache/x does not compute what /ckpt/iter_0000100 computes: tensors: differ: model.norm.weight "
    "(max |diff| 0.25).'; echo 'Export the checkpoint again'; exit 3"
)


def test_a_refused_export_stops_the_job_before_the_engine_starts(tmp_path: Path) -> None:
    port = free_port()
    plan = make_plan(tmp_path / "job", port=port, tasks=[("t1", "echo ran > ran.txt")])
    plan = replace(plan, deployment=replace(plan.deployment, export_step=Step(command=REFUSAL)))
    script = write_job(tmp_path, plan)
    done = run_job(script)
    job_dir = Path(plan.job_dir)
    assert done.returncode == 3 and state(job_dir, "state/finished") == "3"
    log = state(job_dir, "logs/job.log") if (job_dir / "logs/job.log").exists() else done.stdout
    errors = [line for line in log.splitlines() if "error: " in line]
    assert len(errors) >= 1 and "tensors: differ: model.norm.weight (max |diff| 0.25)" in errors[0], log
    assert "the export step failed (exit 3): the engine is not started" in log
    assert state(job_dir, "state/deployment") == "failed"
    assert not (job_dir / "server.pid").exists() and not (job_dir / "ran.txt").exists()


def test_the_engine_starts_once_the_export_step_has_ended(tmp_path: Path) -> None:
    port = free_port()
    plan = make_plan(tmp_path / "job", port=port, tasks=[("t1", "test -f exported && echo ok")])
    step = Step(command="sleep 1; touch exported; echo 'export: reused: /cache/x (0 of 21 tensors written)'")
    plan = replace(plan, deployment=replace(plan.deployment, export_step=step))
    done = run_job(write_job(tmp_path, plan))
    job_dir = Path(plan.job_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    log = done.stdout
    assert log.index("export: reused: /cache/x (0 of 21 tensors written)") < log.index("starting the deployment")
    assert state(job_dir, "tasks/t1/state") == "succeeded"
