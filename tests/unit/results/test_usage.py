"""What an invocation cost: a real job script run here (its clock, its log, bash's `times`) read back as usage, and
the scheduler's accounting parsed from what the local Slurm cluster's `sacct` printed (tests/integration/
test_slurm_evaluate.py checks a real job's against `sacct` itself)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from ckpteval.cluster.slurm import elapsed_seconds, parse_sacct_allocation
from ckpteval.results.model import InvocationResults
from ckpteval.results.table import table_rows, usage_note
from ckpteval.results.usage import ALLOCATION_FILE, Usage, read_usage
from tests.unit.job.test_script import free_port, make_plan, run_job, write_job

# `sacct -X -n -P -o JobID,Elapsed,AllocTRES,Start,State` as the local cluster (tests/infra, accounting on) printed
# them: jobs of 2 and 3 nodes with 8 fake GPUs each, a CPU-only one, a cancelled one, one cancelled while pending
SACCT_LINES = {
    "171|00:00:06|billing=2,cpu=2,gres/gpu=16,node=2|2026-11-29T01:24:49|COMPLETED": (6.0, 16),
    "208|00:00:00|billing=24,cpu=24,gres/gpu=24,node=3|2026-11-29T01:56:25|COMPLETED": (0.0, 24),
    "198|00:00:06|billing=1,cpu=1,node=1|2026-11-29T01:26:07|COMPLETED": (6.0, 0),
    "169|00:00:01|billing=1,cpu=1,gres/gpu=8,node=1|2026-11-29T01:24:43|CANCELLED by 1001": (1.0, 8),
    "179|00:00:00||2026-11-29T01:25:26|CANCELLED by 1001": (0.0, 0),
}


@pytest.mark.parametrize("line", list(SACCT_LINES))
def test_sacct_allocations_parse_to_elapsed_seconds_and_gpus(line: str) -> None:
    parsed = parse_sacct_allocation(line)
    assert parsed is not None and (parsed["elapsed_seconds"], parsed["gpus"]) == SACCT_LINES[line]
    assert parsed["job"] == line.split("|")[0] and parsed["start"] is not None
    assert parsed["state"] == line.split("|")[4].split(" ")[0]


def test_what_is_not_an_allocation_is_none() -> None:
    assert parse_sacct_allocation("") is None  # a job sacct does not know: it prints nothing
    assert parse_sacct_allocation("sacct: error: Problem talking to the database: Connection refused") is None
    assert elapsed_seconds("INVALID") is None and elapsed_seconds("05:07") == 307.0
    assert elapsed_seconds("1-02:00:05") == 93605.0  # days, as sacct writes a long job


def test_a_real_local_job_reports_its_wall_time_phases_and_cpu_time(tmp_path: Path) -> None:
    """A job whose deployment takes 2 s to become healthy and whose task burns a second of CPU."""
    port = free_port()
    loop = 'exec("while time.process_time() - t < 1.0: pass")'
    burn = f"{sys.executable} -c 'import time; t = time.process_time(); {loop}'"
    plan = make_plan(tmp_path / "job", port=port, tasks=[("a", burn)])
    job = Path(plan.job_dir)
    started = time.time()
    proc = run_job(write_job(tmp_path, plan), DELAY="2")
    wall = time.time() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job / "logs").mkdir(exist_ok=True)
    (job / "logs" / "job.log").write_text(proc.stdout)  # where the backend sends the script's output

    usage = read_usage(job, served_device="cpu", deployment_kind="megatron/builtin")
    assert usage is not None and usage.source == "job clock" and usage.gpus == 0 and usage.gpu_hours == 0
    assert abs(usage.wall_seconds - wall) <= 2.0  # the job's clock has whole seconds
    assert usage.phases["startup"] >= 1.0 and usage.phases["tasks"] >= 0.0
    assert sum(usage.phases.values()) == pytest.approx(usage.wall_seconds, abs=0.01)
    assert usage.cpu_seconds is not None and usage.cpu_seconds >= 1.0  # the task's second, at least
    assert usage.label().startswith(f"CPU: {usage.wall_seconds:.0f} s wall, ")

    # on a GPU: wall x 1; from the scheduler: its numbers, whatever the job's clock says
    on_gpu = read_usage(job, served_device="cuda:0", deployment_kind="megatron/builtin")
    assert on_gpu is not None and on_gpu.gpus == 1 and on_gpu.gpu_hours == round(on_gpu.wall_seconds / 3600, 6)
    allocation = parse_sacct_allocation(next(iter(SACCT_LINES)))
    (job / ALLOCATION_FILE).write_text(json.dumps(allocation))
    slurm = read_usage(job, served_device="cuda:0", deployment_kind="megatron/export-deploy")
    assert slurm is not None and (slurm.source, slurm.wall_seconds, slurm.gpus) == ("sacct", 6.0, 16)
    assert slurm.gpu_hours == round(6 * 16 / 3600, 6)
    assert sum(slurm.phases.values()) >= 6.0 - 0.01  # every second of the allocation in one phase


def test_the_table_footer_says_what_it_cost() -> None:
    usage = Usage("sacct", 754.0, 8, 1.675556, {"startup": 312.0, "tasks": 430.0, "idle": 12.0})
    results = InvocationResults(invocation="abcd1234", created="now", status="succeeded", usage=usage.to_json())
    note = usage_note(results)
    assert note == "used 1.68 GPU-h (8 GPUs × 12.6 min, sacct): start-up 312, tasks 430, idle 12 s"
    assert note in table_rows([results])[2] and len(note) <= 80
    again = InvocationResults.from_json(json.loads(json.dumps(results.to_json())))
    assert again.usage == results.usage
