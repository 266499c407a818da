"""The job-backend interface: everything that differs between running a job on this machine and on Slurm.

A backend plans a job for a compiled config (`prepare`, which touches nothing), and acts on a recorded
invocation (`status`, `log_lines`, `cancel`, `results`, `resume`). A prepared job previews itself and is
submitted into a `Job` handle (submitit's / PSI/J's shape): follow it to its end, stop it on Ctrl-C,
collect its results. `LocalBackend` (`ckpteval.execution.local`) runs the job script as a process group
here; `SlurmBackend` (`ckpteval.execution.slurm`) submits it with nemo-run over SSH. Nothing outside the
two implementations asks where a job runs: `ckpteval.api.backend_for` picks one, from the config or from
the record.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ckpteval.config.compile import CompiledConfig
    from ckpteval.config.preview import PreviewPanel
    from ckpteval.execution.events import Reporter
    from ckpteval.execution.snapshot import JobSnapshot
    from ckpteval.execution.state import State
    from ckpteval.invocation.record import InvocationRecord
    from ckpteval.results.model import InvocationResults


@dataclass(frozen=True)
class InvocationStatus:
    """An invocation's state and its tasks' states."""

    record: InvocationRecord
    state: State
    snapshot: JobSnapshot | None
    detail: str = ""  # e.g. Slurm's pending reason
    slurm_job: str | None = None  # the Slurm job id (latest attempt)
    log_tail: str = ""  # the end of the job's log, when it failed


@dataclass(frozen=True)
class JobEnd:
    """How a followed job ended: our state, a few words on why, and (when worth showing) its log's end."""

    state: State
    message: str = ""  # e.g. "the job ended failed; last lines of its log:" (empty: nothing to show)
    log_tail: str = ""


class Job(Protocol):
    """A submitted (or started) job of one invocation."""

    record: InvocationRecord
    exports_here: bool  # True: the caller exports the results; False: the job exports them itself
    runs_detached: bool  # True: the job runs on without the caller (Slurm); False: it is the caller's child

    def follow(self, report: Reporter) -> None:
        """Report progress until the job ends; KeyboardInterrupt propagates (see `interrupt`)."""
        ...

    def interrupt(self) -> bool:
        """What Ctrl-C does to the job: True when it stopped it (its results are then collected), False
        when the job keeps running (the caller may cancel it)."""
        ...

    def collect(self) -> InvocationResults:
        """The job's results, written to its results.json."""
        ...

    def end(self, results: InvocationResults) -> JobEnd:
        """How the ended job went, given its collected results (a failure comes with its log's end)."""
        ...

    def close(self) -> None:
        """Release what following needed (a connection)."""
        ...


class PreparedJob(Protocol):
    """A planned job: nothing written, nothing contacted (unless a preview is asked to check)."""

    def check_checkpoint(self, *, check: bool = False) -> list[PreviewPanel]:
        """Describe the checkpoint the job serves and refuse (DeploymentError) when its backend cannot serve it;
        the description as a preview panel. Read-only; on a cluster only with `check` (a real run reads it in
        `submit`, before anything is written)."""
        ...

    def preview(self, *, check: bool = False) -> list[PreviewPanel]:
        """The panels after the compiled config: the job script, and on Slurm the sbatch script and squash plan."""
        ...

    def submit(self, report: Reporter) -> Job:
        """Write the job's files, record the invocation, start or submit the job."""
        ...


class JobBackend(Protocol):
    """Where jobs run: this machine, or a Slurm cluster."""

    executor: str

    def prepare(self, compiled: CompiledConfig, invocation: str, *, force_squash: bool = False) -> PreparedJob: ...

    def status(self, record: InvocationRecord) -> InvocationStatus: ...

    def log_lines(self, record: InvocationRecord, *, follow: bool = False, source: str = "job") -> Iterator[str]:
        """The job's log (`job`), the deployment's (`deployment`) or a task client's (a task name)."""
        ...

    def cancel(self, record: InvocationRecord) -> str:
        """Stop the job; returns what was done, in words."""
        ...

    def results(self, record: InvocationRecord) -> InvocationResults:
        """results.json, or the results collected now (partial while the job runs)."""
        ...

    def resume(self, record: InvocationRecord, report: Reporter) -> Job:
        """Run a stopped invocation's job again (finished tasks skipped); refused while it still runs."""
        ...


def task_log(record: InvocationRecord, source: str, *, exists: Callable[[str], bool] | None = None) -> str:
    """The log file (relative to the job dir) of `source`: job, deployment, or a task (the newest started
    repeat of a repeated task when `exists` (a predicate on the relative path) is given, else its first)."""
    from ckpteval.errors import EvaluationError
    from ckpteval.invocation.jobdir import JobDir

    if source == "job":
        return JobDir.JOB_LOG
    if source == "deployment":
        return JobDir.DEPLOYMENT_LOG
    task = record.task(source)
    if task is None:
        raise EvaluationError(
            f"Invocation {record.id} has no task '{source}'.",
            hint="Choose job, deployment, or one of: " + ", ".join(record.task_names) + ".",
        )
    from ckpteval.tasks.repeats import current_log, run_layouts

    rel = current_log(run_layouts(task.repeats), lambda log: exists is not None and exists(f"{task.dir}/{log}"))
    return f"{task.dir}/{rel}"
