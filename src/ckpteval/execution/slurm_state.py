"""What the Slurm backend knows of a submitted job between commands: how to reach its cluster again, its
state from Slurm's view and its own state files (kept in the record once it has ended), the end of its
log, and its result files fetched back into `<record dir>/job/`."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.cluster.jobview import RemoteJobView
from ckpteval.cluster.session import ClusterSession
from ckpteval.cluster.slurm import SlurmJobState
from ckpteval.config.profiles import Profile, saved_profile
from ckpteval.errors import ClusterError
from ckpteval.execution.backend import ExecutorView, InvocationStatus
from ckpteval.execution.snapshot import JobSnapshot, TaskSnapshot
from ckpteval.execution.state import State, end_state
from ckpteval.invocation.jobdir import JobDir
from ckpteval.invocation.record import FinalStatus, InvocationRecord, TaskStatus
from ckpteval.results.model import InvocationResults

LOG_TAIL_LINES = 30


@dataclass
class SlurmSubmission:
    """The Slurm executor's part of an invocation record: how the job was submitted, and what came of it."""

    connection: dict[str, Any]  # the profile as it was at submission (secrets redacted): how to reach the cluster
    sbatch: dict[str, Any]  # the `SbatchSpec` fields, resubmitted as they are by `resume`
    job_ids: list[str] = field(default_factory=list)  # every attempt, latest last
    nemo_run_experiment: str | None = None
    nemo_run_dir: str | None = None
    submit_error: str | None = None  # why the latest submission was refused
    results_of_job: str | None = None  # the job whose results were fetched (a resubmission makes them stale)
    # `evaluate watch`'s kept job: the invocation ran as the step of this name in job `job_id` (not a job of its own)
    step: str | None = None
    step_id: str | None = None  # its `JOB.STEP`, once Slurm has said it

    @property
    def job_id(self) -> str | None:
        return self.job_ids[-1] if self.job_ids else None


def submission_of(record: InvocationRecord) -> SlurmSubmission:
    found = record.placement_as(SlurmSubmission)
    if found is None:
        raise ClusterError(f"Invocation {record.id} has no Slurm submission recorded.")
    return found


def slurm_job_id(record: InvocationRecord) -> str | None:
    """The Slurm job id of the invocation's latest attempt (None: never submitted)."""
    found = record.placement_as(SlurmSubmission)
    return found.job_id if found else None


def slurm_step(record: InvocationRecord) -> str | None:
    """The name of the step the invocation ran as in `evaluate watch`'s kept job (None: a job of its own)."""
    found = record.placement_as(SlurmSubmission)
    return found.step if found else None


def slurm_view(job_id: str | None, step: str | None = None) -> ExecutorView | None:
    """The Slurm job, as `status` shows it (`evaluate status --json`: `slurm_job`; `slurm_step` for an
    invocation run as a step of watch's kept job: its `JOB.STEP` once known)."""
    if not job_id:
        return None
    if step:
        return ExecutorView(
            label=f"step {step} of kept job {job_id.split('.')[0]}",
            fields={"slurm_job": job_id.split(".")[0], "slurm_step": job_id},
        )
    return ExecutorView(label=f"job {job_id}", fields={"slurm_job": job_id})


def record_profile(record: InvocationRecord) -> Profile:
    """The profile the invocation was submitted with (how to reach its cluster)."""
    saved = submission_of(record).connection
    if not saved:
        raise ClusterError(f"Invocation {record.id} does not say how to reach its cluster (no connection recorded).")
    return saved_profile(saved, executor="slurm")


def open_session(record: InvocationRecord, *, on_reconnect: Callable[[str], None] | None = None) -> ClusterSession:
    """A connection to the invocation's cluster, reopened if it drops."""
    return ClusterSession(record_profile(record), on_reconnect=on_reconnect)


def local_job_copy(record: InvocationRecord) -> Path:
    """Where the job directory's result files are fetched to: `<record dir>/job`."""
    return record.path / "job"


def state_dirs(record: InvocationRecord) -> list[str]:
    """The job directories whose small files make up a snapshot."""
    return JobDir.state_dirs([(t.name, t.dir, t.repeats) for t in record.tasks])


def combine_state(slurm: SlurmJobState, snapshot: JobSnapshot | None) -> tuple[State, str]:
    """The invocation's state (pending, running, succeeded, failed, cancelled, unknown) and a detail,
    from Slurm's view of the job and the job's own state files."""
    finished = snapshot.finished if snapshot else None
    if slurm.pending:
        return "pending", slurm.reason or slurm.state.lower()
    if slurm.active:
        if slurm.state == "SUSPENDED":
            return "running", "suspended"
        return "running", ""
    if end_state(None, slurm.state) is None:  # Slurm no longer knows the job: the job's own exit code decides
        ours = end_state(finished)
        if ours is None:
            return "unknown", slurm.reason or "Slurm does not know the job any more"
        return ours, "" if ours == "succeeded" else f"exit {finished}"
    ours = end_state(finished, slurm.state) or "failed"
    detail = ""
    if ours == "failed":
        if slurm.state == "TIMEOUT":
            detail = "time limit reached; `evaluate resume` continues where it stopped"
        elif slurm.state in ("NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"):
            detail = slurm.state.lower().replace("_", " ")
        elif snapshot and snapshot.deployment == "failed":
            detail = "the deployment failed"
        elif snapshot:
            failed = [t.name for t in snapshot.tasks if t.state.startswith("failed")]
            detail = f"failed: {', '.join(failed)}" if failed else f"exit {slurm.exit_code or finished}"
    elif ours == "cancelled" and slurm.state == "PREEMPTED":
        detail = "preempted; `evaluate resume` continues where it stopped"
    return ours, detail


def log_tail(session: ClusterSession, record: InvocationRecord, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of the job's log (or, if the job script never ran, of nemo-run's Slurm output)."""
    text = RemoteJobView(session, record.job_dir).read_text(JobDir.JOB_LOG)
    if not text and submission_of(record).nemo_run_dir and slurm_job_id(record):
        text = session.call(lambda r: r.read_text_if_exists(slurm_output_path(record)))
    return "\n".join((text or "").splitlines()[-lines:])


def slurm_output_path(record: InvocationRecord) -> str:
    """nemo-run's sbatch output file of the latest job (Slurm's own messages, nemo-run's setup)."""
    if slurm_step(record):  # a step of watch's kept job: srun's own messages
        return kept_step_output(record.job_dir)
    name = f"ckpteval-{record.id}"
    nemo_run_dir = submission_of(record).nemo_run_dir or ""
    return posixpath.join(nemo_run_dir, f"sbatch_{name}_{slurm_job_id(record)}.out")


def kept_step_output(job_dir: str) -> str:
    """srun's own messages of an invocation run as a step of watch's kept job (`logs -s slurm`)."""
    return posixpath.join(job_dir, "logs", "slurm-step.out")


def submit_failed(record: InvocationRecord) -> InvocationStatus | None:
    if slurm_job_id(record):
        return None
    submission = record.placement_as(SlurmSubmission)
    error = (submission.submit_error if submission else None) or "it was never submitted"
    return InvocationStatus(record=record, state="failed", snapshot=None, detail=f"not submitted: {error}")


def remembered(record: InvocationRecord) -> InvocationStatus | None:
    """The final status saved when the latest job was last seen ended (no connection needed)."""
    final = record.final
    if final is None or final.job != slurm_job_id(record):
        return None
    tasks = tuple(TaskSnapshot(**dataclasses.asdict(t)) for t in final.tasks)
    snapshot = JobSnapshot(
        deployment=final.deployment,
        tasks=tasks,
        finished=final.finished,
        ended=final.ended,
        others=tuple(final.others.items()),
    )
    return InvocationStatus(
        record=record,
        state=final.state,  # type: ignore[arg-type]
        snapshot=snapshot,
        detail=final.detail,
        executor_view=slurm_view(submission_of(record).step_id or slurm_job_id(record), slurm_step(record)),
        log_tail=final.log_tail,
    )


def remember(status: InvocationStatus) -> None:
    record, snapshot = status.record, status.snapshot
    assert snapshot is not None
    record.final = FinalStatus(
        job=slurm_job_id(record),
        state=status.state,
        detail=status.detail,
        log_tail=status.log_tail,
        deployment=snapshot.deployment,
        finished=snapshot.finished,
        tasks=[TaskStatus(**dataclasses.asdict(t)) for t in snapshot.tasks],
        ended=snapshot.ended,
        others=dict(snapshot.others),
    )
    record.save()


def record_allocation(session: ClusterSession, job_id: str, local: Path, *, step: str | None = None) -> None:
    """The scheduler's accounting of the job's allocation (sacct), into the local copy's state/allocation.json
    (`results.usage` reads it: the GPU-hours); nothing when sacct does not know the job. With `step` (an
    invocation run in watch's kept job): that step's own elapsed time, not the kept job's."""
    import json

    from ckpteval.cluster.slurm import job_allocation, step_allocation
    from ckpteval.results.usage import ALLOCATION_FILE

    if step:
        allocation = session.call(lambda r: step_allocation(r, job_id, step))
    else:
        allocation = session.call(lambda r: job_allocation(r, job_id))
    if allocation is not None:
        target = local / ALLOCATION_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(allocation, indent=2) + "\n", encoding="utf-8")


def fetch_results(session: ClusterSession, record: InvocationRecord, *, final: bool) -> InvocationResults:
    """Fetch the job directory's result files and collect the results (written to results.json, here and
    on the cluster, when `final`: the job has ended)."""
    from ckpteval.cluster.fetch import fetch_job_dir
    from ckpteval.results.collect import collect_results
    from ckpteval.results.store import write_results

    local = local_job_copy(record)
    session.call(lambda r: fetch_job_dir(r, record.job_dir, local))
    job_id = slurm_job_id(record)
    if final and job_id:
        record_allocation(session, job_id, local, step=slurm_step(record))
    results = collect_results(
        local, record.task_dirs, invocation=record.id, created=record.created, model=record.model, label=record.label
    )
    if final:
        path = write_results(local, results)
        text = path.read_text(encoding="utf-8")
        session.call(lambda r: r.write_text_atomic(JobDir(record.job_dir).join(JobDir.RESULTS), text))
        record.local_results_dir = str(local)
        submission_of(record).results_of_job = slurm_job_id(record)  # a resubmitted job makes them stale
        record.save()
    return results
