"""A judged task on the real test cluster: `evaluate --batch CI -c tiny -t mtbench judge=builtin ...` deploys
the model and, on a node of its own in the same allocation, the judge (SmolLM2 as both), runs one MT-Bench
question against them. Two deployments in `status`, the allocation sized for both, the judge's step on a
node of its own, reached at its name. Needs the `judge` extra (MT-Bench's harness).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpteval.execution.slurm_state import slurm_job_id
from ckpteval.invocation.record import load_record
from tests.integration.slurm_jobs import free_port, sacct_steps, wait_for
from tests.integration.test_slurm_evaluate import cli, job_profile  # noqa: F401  (a fixture)

pytest.importorskip("core_evals.mtbench")
# about 20 minutes at load ~25 (two SmolLM2 servers on CPU, one MT-Bench question and its judgments): the
# long tier, like tests/e2e/tasks/test_judged.py
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(2400)]

PARAMS = "evaluation.nemo_evaluator_config.config.params"


@pytest.fixture(scope="module")
def smollm2_checkpoint(infra) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """SmolLM2 as a Megatron checkpoint where the CI user's jobs can read it (a copy of the cached one)."""
    from tests.e2e.conftest import packaged_checkpoint

    tests_dir = Path(infra.user_home) / "ckpteval-tests"
    tests_dir.mkdir(exist_ok=True)
    shutil.chown(tests_dir, user=infra.ssh_user)
    path = tests_dir / f"smollm2-{uuid.uuid4().hex[:8]}"
    shutil.copytree(packaged_checkpoint("smol"), path)
    subprocess.run(["chmod", "-R", "a+rX", str(path)], check=True)
    yield str(path)
    shutil.rmtree(path, ignore_errors=True)


def test_a_judge_runs_on_a_node_of_its_own_in_the_same_allocation(
    job_profile,  # noqa: F811
    infra,
    smollm2_checkpoint: str,
) -> None:  # type: ignore[no-untyped-def]
    env = job_profile(nodes=1, time="00:40:00")  # the job asks for the two nodes its two deployments need
    argv = [
        *("-c", "tiny", "--env-file", str(env), "-t", "mtbench", "--batch", "CI"),
        *(f"run.model={smollm2_checkpoint}", f"deployment.port={free_port()}"),
        *("judge=builtin", f"judge.checkpoint_path={smollm2_checkpoint}", f"judge.port={free_port()}"),
        *("deployment.access_log=true", "judge.access_log=true"),
        *(f"{PARAMS}.limit_samples=1", f"{PARAMS}.max_new_tokens=8", f"{PARAMS}.parallelism=1"),
        *("judge.max_error_rate=1.0", f"+{PARAMS}.extra.judge.max_tokens=16"),
    ]
    shown = cli(*argv, "--dry-run")
    assert shown.exit_code == 0, shown.output
    assert "a second server on node 2 of the allocation" in shown.output
    submitted = cli(*argv)
    assert submitted.exit_code == 0, submitted.output
    invocation = submitted.stdout.strip().splitlines()[-1]
    record = load_record(invocation)
    job = str(slurm_job_id(record))

    def status() -> dict:  # type: ignore[type-arg]
        return json.loads(cli("status", invocation, "--json").stdout)[0]

    final = wait_for(
        lambda: (s := status()["state"]) not in ("pending", "running") and s, timeout=2100, interval=5, what="end"
    )
    log = cli("logs", invocation).output
    assert final == "succeeded", log[-4000:] + cli("logs", invocation, "-s", "mtbench").output[-4000:]
    assert status()["deployments"] == {"model": "stopped", "judge": "stopped"}
    shown_status = cli("status", invocation).output
    assert "judge" in shown_status and "deployment" in shown_status

    # the allocation holds both deployments' nodes; the judge's step ran on the second
    alloc = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "NNodes"], capture_output=True, text=True)
    assert alloc.stdout.strip() == "2"
    steps = dict(sacct_steps(job))
    assert "deployment" in steps and "judge" in steps
    placed = subprocess.run(
        ["sacct", "-n", "-P", "-j", job, "-o", "JobName,NodeList"], capture_output=True, text=True
    ).stdout.splitlines()
    nodes = dict(line.split("|", 1) for line in placed if "|" in line)
    assert nodes["judge"] != nodes["deployment"]
    assert "the judge runs on its own node(s) from" in log and "judge healthy" in log

    # each judgment was recorded (the requests per server are counted in tests/e2e/tasks/test_judged.py)
    judgments = (Path(record.job_dir) / "tasks" / "mtbench" / "output").rglob("judgements/*_single.jsonl")
    rows = [json.loads(line) for path in judgments for line in path.read_text().splitlines() if line.strip()]
    assert len(rows) == 2
