"""status, cancel, logs and results of an invocation that runs on Slurm — from any shell, any time later.

The record (see `ckpteval.job.invocation`) holds how to reach the cluster (the profile as it was at
submission), the Slurm job id and the job directory. Each command opens one connection: squeue/sacct
for Slurm's view of the job, the job's state files for ours, `scancel` to stop it. Nothing here imports
nemo-run. Results are fetched into `<record dir>/job/` (result files, not caches) and collected there.
"""

from __future__ import annotations

import dataclasses
import posixpath
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ckpteval.cluster.jobview import LogTail, RemoteJobView
from ckpteval.cluster.session import ClusterSession
from ckpteval.cluster.slurm import TERMINAL, SlurmJobState, cancel_job, job_state
from ckpteval.config.profiles import Profile
from ckpteval.errors import ClusterError, EvaluationError
from ckpteval.job.follow import JobSnapshot, ProgressReader, TaskSnapshot, take_snapshot
from ckpteval.job.invocation import InvocationRecord
from ckpteval.job.manage import InvocationStatus, _task_dirs
from ckpteval.results.model import InvocationResults

LOG_TAIL_LINES = 30


def record_profile(record: InvocationRecord) -> Profile:
    """The profile the invocation was submitted with (how to reach its cluster)."""
    saved = record.extra.get("connection")
    if not isinstance(saved, dict):
        raise ClusterError(f"Invocation {record.id} does not say how to reach its cluster (no connection recorded).")
    known = {f.name for f in dataclasses.fields(Profile)}
    return Profile(**{k: v for k, v in saved.items() if k in known})


def open_session(record: InvocationRecord, *, on_reconnect: Callable[[str], None] | None = None) -> ClusterSession:
    """A connection to the invocation's cluster, reopened if it drops."""
    return ClusterSession(record_profile(record), on_reconnect=on_reconnect)


def local_job_copy(record: InvocationRecord) -> Path:
    """Where the job directory's result files are fetched to: `<record dir>/job`."""
    return record.path / "job"


def state_dirs(record: InvocationRecord) -> list[str]:
    """The job directories whose small files make up a snapshot: state/, each task dir and its output."""
    from ckpteval.tasks.repeats import run_layouts

    repeats = record.extra.get("task_repeats") or {}
    dirs = ["state"]
    for name, task_dir in _task_dirs(record):
        dirs += [task_dir, *(f"{task_dir}/{layout.output}" for layout in run_layouts(int(repeats.get(name, 0))))]
    return dirs


def combine_state(slurm: SlurmJobState, snapshot: JobSnapshot | None) -> tuple[str, str]:
    """The invocation's state (pending, running, succeeded, failed, cancelled, unknown) and a detail,
    from Slurm's view of the job and the job's own state files."""
    finished = snapshot.finished if snapshot else None
    if slurm.pending:
        return "pending", slurm.reason or slurm.state.lower()
    if slurm.active:
        if slurm.state == "SUSPENDED":
            return "running", "suspended"
        return "running", ""
    ours = TERMINAL.get(slurm.state)
    if ours is None:  # Slurm no longer knows the job: the job's own exit code decides
        if finished is None:
            return "unknown", slurm.reason or "Slurm does not know the job any more"
        ours = {0: "succeeded", 143: "cancelled"}.get(finished, "failed")
        return ours, "" if ours == "succeeded" else f"exit {finished}"
    if ours == "succeeded" and finished not in (None, 0):
        ours = "failed"
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


def settle_tasks(snapshot: JobSnapshot, active: bool) -> JobSnapshot:
    """Once the job has stopped, a task still marked running was interrupted: say so."""
    if active:
        return snapshot
    tasks = tuple(dataclasses.replace(t, state="cancelled") if t.state == "running" else t for t in snapshot.tasks)
    deployment = "stopped" if snapshot.deployment in ("starting", "ready") else snapshot.deployment
    return JobSnapshot(deployment=deployment, tasks=tasks, finished=snapshot.finished)


def _progress_reader() -> ProgressReader:
    from ckpteval.tasks.progress import progress_reader

    return progress_reader


def log_tail(session: ClusterSession, record: InvocationRecord, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of the job's log (or, if the job script never ran, of nemo-run's Slurm output)."""
    view = RemoteJobView(session, record.job_dir)
    text = view.read_text("logs/job.log")
    if not text and record.extra.get("nemo_run_dir") and record.slurm_job_id:
        text = session.call(lambda r: r.read_text_if_exists(slurm_output_path(record)))
    return "\n".join((text or "").splitlines()[-lines:])


def slurm_output_path(record: InvocationRecord) -> str:
    """nemo-run's sbatch output file of the latest job (Slurm's own messages, nemo-run's setup)."""
    name = f"ckpteval-{record.id}"
    return posixpath.join(record.extra.get("nemo_run_dir", ""), f"sbatch_{name}_{record.slurm_job_id}.out")


def _submit_failed(record: InvocationRecord) -> InvocationStatus | None:
    if record.slurm_job_id:
        return None
    error = record.extra.get("submit_error") or "it was never submitted"
    return InvocationStatus(record=record, state="failed", snapshot=None, detail=f"not submitted: {error}")


def _remembered(record: InvocationRecord) -> InvocationStatus | None:
    """The final status saved when the latest job was last seen ended (no connection needed)."""
    final = record.extra.get("final")
    if not isinstance(final, dict) or final.get("job") != record.slurm_job_id:
        return None
    tasks = tuple(TaskSnapshot(**t) for t in final["tasks"])
    snapshot = JobSnapshot(deployment=final["deployment"], tasks=tasks, finished=final["finished"])
    return InvocationStatus(
        record=record,
        state=final["state"],
        snapshot=snapshot,
        detail=final["detail"],
        slurm_job=record.slurm_job_id,
        log_tail=final["log_tail"],
    )


def _remember(status: InvocationStatus) -> None:
    record, snapshot = status.record, status.snapshot
    assert snapshot is not None
    record.extra["final"] = {
        "job": record.slurm_job_id,
        "state": status.state,
        "detail": status.detail,
        "log_tail": status.log_tail,
        "deployment": snapshot.deployment,
        "finished": snapshot.finished,
        "tasks": [dataclasses.asdict(t) for t in snapshot.tasks],
    }
    record.save()


def slurm_status(record: InvocationRecord) -> InvocationStatus:
    """The invocation's state from Slurm (squeue/sacct) and the job's state files, in one connection.

    Once the latest job has ended its status is kept in the record, so listing old invocations does
    not connect to their clusters again.
    """
    failed = _submit_failed(record) or _remembered(record)
    if failed:
        return failed
    with open_session(record) as session:
        slurm = session.call(lambda r: job_state(r, str(record.slurm_job_id)))
        view = RemoteJobView(session, record.job_dir)
        view.prefetch(state_dirs(record))
        snapshot = take_snapshot(view, _task_dirs(record), _progress_reader())
        state, detail = combine_state(slurm, snapshot)
        tail = log_tail(session, record) if state == "failed" else ""
    status = InvocationStatus(
        record=record,
        state=state,
        snapshot=settle_tasks(snapshot, slurm.active),
        detail=detail,
        slurm_job=slurm.job_id,
        log_tail=tail,
    )
    if state in ("succeeded", "failed", "cancelled"):
        _remember(status)
    return status


def slurm_cancel(record: InvocationRecord) -> str:
    """scancel the job and wait until Slurm has stopped it (the deployment with it)."""
    if not record.slurm_job_id:
        return f"invocation {record.id} was never submitted"
    with open_session(record) as session:
        before = session.call(lambda r: job_state(r, str(record.slurm_job_id)))
        if not before.active:
            return f"invocation {record.id} is not running (Slurm job {before.job_id}: {before.state.lower()})"
        after = session.call(lambda r: cancel_job(r, str(record.slurm_job_id)))
    if after.active:
        return f"asked Slurm to cancel job {after.job_id} of invocation {record.id}; it is still {after.state.lower()}"
    return f"cancelled invocation {record.id} (Slurm job {after.job_id}: {after.state.lower()})"


def _log_rel(record: InvocationRecord, source: str) -> str:
    from ckpteval.job.manage import _log_path

    return _log_path(record, source)


def slurm_log_lines(record: InvocationRecord, *, follow: bool = False, source: str = "job") -> Iterator[str]:
    """The job's log lines (`job`, `deployment`, a task name, or `slurm` for nemo-run's sbatch output);
    with `follow`, keep yielding new lines until the job has ended (reconnecting if the connection drops)."""
    if not record.slurm_job_id:
        raise EvaluationError(
            f"Invocation {record.id} was never submitted: it has no log.",
            hint=str(record.extra.get("submit_error") or ""),
        )
    path = slurm_output_path(record) if source == "slurm" else posixpath.join(record.job_dir, _log_rel(record, source))
    with open_session(record) as session:
        tail = LogTail(session, path)
        last_check = 0.0
        while True:
            yield from tail.read()
            if not follow:
                yield from tail.read(final=True)
                return
            if time.monotonic() - last_check > 3.0:
                last_check = time.monotonic()
                if not session.call(lambda r: job_state(r, str(record.slurm_job_id))).active:
                    yield from tail.read(final=True)
                    return
            time.sleep(1.0)


def fetch_results(session: ClusterSession, record: InvocationRecord, *, final: bool) -> InvocationResults:
    """Fetch the job directory's result files and collect the results (written to results.json, here and
    on the cluster, when `final`: the job has ended)."""
    from ckpteval.cluster.fetch import fetch_job_dir
    from ckpteval.results.collect import collect_results
    from ckpteval.results.store import RESULTS_FILE, write_results

    local = local_job_copy(record)
    session.call(lambda r: fetch_job_dir(r, record.job_dir, local))
    results = collect_results(
        local,
        _task_dirs(record),
        invocation=record.id,
        created=record.created,
        model=record.extra.get("model"),
        label=record.extra.get("label"),
    )
    if final:
        path = write_results(local, results)
        text = path.read_text(encoding="utf-8")
        session.call(lambda r: r.write_text_atomic(posixpath.join(record.job_dir, RESULTS_FILE), text))
        record.local_results_dir = str(local)
        record.extra["results_of_job"] = record.slurm_job_id  # a resubmitted job makes them stale
        record.save()
    return results


def slurm_results(record: InvocationRecord) -> InvocationResults:
    """results.json fetched before, or fetched from the cluster now (partial while the job still runs)."""
    from ckpteval.results.store import RESULTS_FILE, read_results

    local = local_job_copy(record) / RESULTS_FILE
    if local.is_file() and record.extra.get("results_of_job") == record.slurm_job_id:
        return read_results(local)
    if not record.slurm_job_id:
        raise EvaluationError(f"Invocation {record.id} was never submitted: it has no results.")
    with open_session(record) as session:
        slurm = session.call(lambda r: job_state(r, str(record.slurm_job_id)))
        return fetch_results(session, record, final=not slurm.active)
