"""A job's state as its files say it: a `JobView` reads them (here or over SSH), `take_snapshot` makes one
snapshot (`ckpteval.execution.follow` reports one per tick while a job runs).

The job writes small state files (`state/*`, `tasks/<dir>/state`, see `JobDir`) and the harness writes
its progress into each task's output dir.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ckpteval.invocation.jobdir import JobDir

if TYPE_CHECKING:
    from ckpteval.tasks.progress import Progress


class JobView(Protocol):
    """Read-only access to a job directory (local files, or SFTP on a cluster)."""

    def read_text(self, rel: str) -> str | None:
        """The file's text, or None when it does not exist (yet)."""
        ...


class LocalJobView:
    """Job files on this machine."""

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir

    def read_text(self, rel: str) -> str | None:
        try:
            return (self.job_dir / rel).read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError):
            return None


@dataclass(frozen=True)
class TaskSnapshot:
    name: str
    dir: str
    state: str  # pending | running | succeeded | failed N | skipped | cancelled
    done: int = 0  # requests answered
    total: int | None = None  # requests in all (None: not known)
    error: str = ""  # a failed task: why (one line from its client log), the log (relative), what to do
    log: str = ""
    hint: str = ""
    docs: int | None = None  # documents done, the unit of the results' n (None: the harness does not say)
    docs_total: int | None = None


@dataclass(frozen=True)
class JobSnapshot:
    deployment: str  # starting | ready | failed | stopped | cancelled | none | "" (not started)
    tasks: tuple[TaskSnapshot, ...]
    finished: int | None  # the job's exit code once it has ended
    requests: str = ""  # how the tasks' requests go, side by side or in groups, and why (state/requests)
    ended: str = ""  # when the job ended (UTC, ISO 8601, state/ended): "" while it runs, or when nothing says
    moved: str = ""  # the deployment serves on another port than planned (it was taken), in the job's words
    # the other roles' deployments the job started (a judge beside the model): (role, state), registry order
    others: tuple[tuple[str, str], ...] = ()

    @property
    def deployments(self) -> dict[str, str]:
        """Every deployment's state, keyed by role, the model's first."""
        return {"model": self.deployment, **dict(self.others)}

    @property
    def succeeded(self) -> bool:
        return self.finished == 0

    @property
    def started(self) -> bool:
        return bool(self.deployment) or any(t.state != "pending" for t in self.tasks)


ProgressReader = Callable[[JobView, str], "Progress"]


def take_snapshot(view: JobView, tasks: Sequence[tuple[str, str]], progress: ProgressReader | None) -> JobSnapshot:
    """The job's state now. `tasks` is (name, dir) in run order."""
    finished_text = view.read_text(JobDir.FINISHED)
    finished = int(finished_text.strip()) if finished_text and finished_text.strip().lstrip("-").isdigit() else None
    deployment = (view.read_text(JobDir.DEPLOYMENT_STATE) or "").strip()
    snaps = []
    for name, task_dir in tasks:
        state = (view.read_text(JobDir.task_state(task_dir)) or "").strip() or "pending"
        if state == "pending" and view.read_text(JobDir.task_done(task_dir)) is not None:
            state = "succeeded"
        counts: dict[str, Any] = {}
        if progress is not None and state != "pending":
            p = progress(view, task_dir)
            counts = {"done": p.done, "total": p.total, "docs": p.docs, "docs_total": p.docs_total}
        why: dict[str, Any] = _failure(view, task_dir) if state.startswith("failed") else {}
        snaps.append(TaskSnapshot(name=name, dir=task_dir, state=state, **counts, **why))
    requests = (view.read_text(JobDir.REQUESTS) or "").strip()
    ended = (view.read_text(JobDir.ENDED) or "").strip() if finished is not None else ""
    moved = (view.read_text(JobDir.DEPLOYMENT_MOVED) or "").strip()
    return JobSnapshot(
        deployment=deployment,
        tasks=tuple(snaps),
        finished=finished,
        requests=requests,
        ended=ended,
        others=_other_deployments(view),
        moved=moved,
    )


def _other_deployments(view: JobView) -> tuple[tuple[str, str], ...]:
    """(role, state) of each other role's deployment the job started (its state file exists)."""
    from ckpteval.job.roles import roles

    out = []
    for r in roles():
        if not r.evaluated:
            state = (view.read_text(r.state_file) or "").strip()
            if state:
                out.append((r.name, state))
    return tuple(out)


def _failure(view: JobView, task_dir: str) -> dict[str, str]:
    """Why a failed task failed, from its client log (a repeated task's logs are per repeat: see results)."""
    from ckpteval.tasks.failure import explain_log

    log = JobDir.task_logs(task_dir, 0)[0]
    text = view.read_text(log)
    if text is None:
        return {}
    why = explain_log(text, log=log)
    return {"error": why.reason, "log": why.log, "hint": why.hint or ""}


def settle_tasks(snapshot: JobSnapshot, active: bool, state: str | None = None) -> JobSnapshot:
    """What the state files say, once the job has stopped (`active` False) as the invocation `state` says it
    ended: a task still marked running was interrupted (cancelled); a cancelled job's deployment reads
    cancelled, and so does each task that never started (`resume` runs them still: it goes by each task's
    `.done`, not by these words); any other job's deployment reads stopped."""
    if active:
        return snapshot
    cancelled = state == "cancelled"
    tasks = tuple(
        dataclasses.replace(t, state="cancelled") if t.state == "running" or (cancelled and t.state == "pending") else t
        for t in snapshot.tasks
    )

    def settled(deployment: str) -> str:
        if deployment in ("starting", "ready") or (cancelled and not deployment):
            return "cancelled" if cancelled else "stopped"
        return deployment

    others = tuple((name, settled(state)) for name, state in snapshot.others)
    return dataclasses.replace(snapshot, deployment=settled(snapshot.deployment), tasks=tasks, others=others)
