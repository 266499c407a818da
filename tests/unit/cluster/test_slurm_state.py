"""How Slurm's view of a job and the job's own state files become what `evaluate status` says."""

from __future__ import annotations

import pytest

from ckpteval.cluster.slurm import ClusterFacts, SlurmJobState, check_request, explain_sbatch_error
from ckpteval.errors import ClusterError
from ckpteval.execution.slurm_state import combine_state
from ckpteval.execution.snapshot import JobSnapshot, TaskSnapshot, settle_tasks


def snap(*task_states: str, deployment: str = "ready", finished: int | None = None) -> JobSnapshot:
    tasks = tuple(TaskSnapshot(name=f"t{i}", dir=f"tasks/t{i}", state=s) for i, s in enumerate(task_states))
    return JobSnapshot(deployment=deployment, tasks=tasks, finished=finished)


@pytest.mark.parametrize(
    ("slurm", "snapshot", "expected"),
    [
        (SlurmJobState("1", "PENDING", reason="Priority"), snap("pending", deployment=""), ("pending", "Priority")),
        (SlurmJobState("1", "REQUEUED"), None, ("pending", "requeued")),
        (SlurmJobState("1", "RUNNING"), snap("running"), ("running", "")),
        (SlurmJobState("1", "COMPLETED", exit_code="0:0"), snap("succeeded", finished=0), ("succeeded", "")),
        (
            SlurmJobState("1", "FAILED", exit_code="1:0"),
            snap("succeeded", "failed 2", finished=1),
            ("failed", "failed: t1"),
        ),
        (
            SlurmJobState("1", "FAILED", exit_code="3:0"),
            snap("pending", deployment="failed", finished=3),
            ("failed", "the deployment failed"),
        ),
        (
            SlurmJobState("1", "TIMEOUT"),
            snap("succeeded", "running"),
            ("failed", "time limit reached; `evaluate resume` continues where it stopped"),
        ),
        (SlurmJobState("1", "CANCELLED"), snap("running", finished=143), ("cancelled", "")),
        (
            SlurmJobState("1", "PREEMPTED"),
            snap("running"),
            ("cancelled", "preempted; `evaluate resume` continues where it stopped"),
        ),
        (SlurmJobState("1", "NODE_FAIL"), snap("running"), ("failed", "node fail")),
        # accounting has forgotten the job: the job's own exit code decides
        (SlurmJobState("1", "UNKNOWN"), snap("succeeded", finished=0), ("succeeded", "")),
        (SlurmJobState("1", "UNKNOWN"), snap("running", finished=143), ("cancelled", "exit 143")),
        (SlurmJobState("1", "UNKNOWN"), snap("running"), ("unknown", "Slurm does not know the job any more")),
    ],
)
def test_combined_state(slurm, snapshot, expected):  # type: ignore[no-untyped-def]
    assert combine_state(slurm, snapshot) == expected


def test_tasks_left_running_by_a_stopped_job_are_cancelled():
    settled = settle_tasks(snap("succeeded", "running", "pending"), active=False)
    assert [t.state for t in settled.tasks] == ["succeeded", "cancelled", "pending"]
    assert settled.deployment == "stopped"
    assert settle_tasks(snap("running"), active=True).tasks[0].state == "running"


def test_a_cancelled_job_reads_cancelled_down_to_the_tasks_it_never_started():
    settled = settle_tasks(snap("succeeded", "running", "pending"), active=False, state="cancelled")
    assert [t.state for t in settled.tasks] == ["succeeded", "cancelled", "cancelled"]
    assert settled.deployment == "cancelled"
    failed = settle_tasks(snap("running", "pending"), active=False, state="failed")
    assert [t.state for t in failed.tasks] == ["cancelled", "pending"] and failed.deployment == "stopped"


def test_unknown_partition_and_account_are_refused_with_what_exists():
    facts = ClusterFacts(partitions=("batch", "interactive"), accounts=("llm", "vision"), user="me")
    with pytest.raises(ClusterError) as err:
        check_request(facts, partition="gpu", account="llm", where="login")
    assert err.value.message == "Partition 'gpu' does not exist on login."
    assert "batch, interactive" in (err.value.hint or "")
    with pytest.raises(ClusterError, match="account 'nlp' is not one me may use") as err:
        check_request(facts, partition="batch", account="nlp", where="login")
    assert "llm, vision" in (err.value.hint or "")
    # associations not enforced: any account goes
    check_request(
        ClusterFacts(partitions=("batch",), accounts=None, user="me"), partition="batch", account="x", where="h"
    )


def test_sbatch_errors_get_a_hint():
    text, hint = explain_sbatch_error(
        "sbatch: error: Batch job submission failed: Requested node configuration is not available\n", None
    )
    assert text == "sbatch: error: Batch job submission failed: Requested node configuration is not available"
    assert hint and "gpus_per_node" in hint
    _, hint = explain_sbatch_error(
        "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
        ClusterFacts(("batch",), ("llm",), "me"),
    )
    assert hint == "Check `account` in the env.toml profile. Your accounts: llm."
