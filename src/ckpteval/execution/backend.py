"""The job-backend interface: everything that differs between the places a job runs.

The steps of an invocation are the same everywhere (`ckpteval.execution.pipeline`); a backend is the
transport under them (submitit's / NeMo-Run's sense): where the job directory is and how the job script
starts its steps, a `JobHost` (one connection to where the job runs) to read the checkpoint, write the job's
files and start the job, and `resume`. A started job is a `Job` handle (submitit's / PSI/J's shape): its
`status`, `cancel`, `read(path)`, `logs` and `results`; follow it to its end, stop it on Ctrl-C, collect its
results. A recorded invocation's handle is re-attached from its record (`JobBackend.attach`), so `evaluate
status/logs/cancel/results` go through the same handle as the run that started the job.

`LocalBackend` (`ckpteval.execution.local`) runs the job script as a process group here; `SlurmBackend`
(`ckpteval.execution.slurm`) submits it with nemo-run over SSH. Nothing outside the backends asks where a
job runs: `ckpteval.execution.backends.backend_for` picks one by the executor a profile or a record names,
from the registry `ckpteval.config.executors`.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ckpteval.checkpoint.description import CheckpointDescription
    from ckpteval.cluster.remote import Remote as Remote  # a host's seam, named for the pipeline's steps
    from ckpteval.config.compile import CompiledConfig
    from ckpteval.config.executors import Launcher
    from ckpteval.config.preview import PreviewPanel
    from ckpteval.config.profiles import Profile
    from ckpteval.execution.events import Reporter
    from ckpteval.execution.planned import PlannedJob
    from ckpteval.execution.snapshot import JobSnapshot
    from ckpteval.execution.state import State
    from ckpteval.invocation.record import InvocationRecord
    from ckpteval.job.build import Toolchain
    from ckpteval.job.plan import JobPlan
    from ckpteval.results.model import InvocationResults


# A step an executor needs where its jobs run before one starts (`JobBackend.staging`; the shipped ones are
# `ckpteval.execution.staging`'s): the planned job, its plan so far, the host it goes to -> the plan that
# reads what it staged.
StagingStep = Callable[["PlannedJob", "JobPlan", "JobHost", "Reporter"], "JobPlan"]


@dataclass(frozen=True)
class ExecutorView:
    """What the job's executor says of where it is, in its own terms (a scheduler's job id, a process on a
    machine): a label for people, and the fields `status --json` adds."""

    label: str  # e.g. "job 1234", "pid 4567 on gpu-box (GPUs 0,1)"
    fields: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class InvocationStatus:
    """An invocation's state and its tasks' states."""

    record: InvocationRecord
    state: State
    snapshot: JobSnapshot | None
    detail: str = ""  # e.g. a scheduler's pending reason
    executor_view: ExecutorView | None = None  # the executor's view of the latest attempt
    log_tail: str = ""  # the end of the job's log, when it failed


@dataclass(frozen=True)
class JobEnd:
    """How a followed job ended: our state, a few words on why, and (when worth showing) its log's end."""

    state: State
    message: str = ""  # e.g. "the job ended failed; last lines of its log:" (empty: nothing to show)
    log_tail: str = ""


class Job(Protocol):
    """A submitted (or started, or re-attached) job of one invocation."""

    record: InvocationRecord
    exports_here: bool  # True: the caller exports the results; False: the job exports them itself
    runs_detached: bool  # True: the job runs on without the caller (Slurm); False: it is the caller's child

    def status(self) -> InvocationStatus:
        """Where the invocation stands now: our state, its tasks', and what the scheduler says."""
        ...

    def state(self) -> State:
        """The invocation's state now (`status().state`)."""
        ...

    def cancel(self) -> str:
        """Stop the job; returns what was done, in words."""
        ...

    def read(self, path: str) -> str | None:
        """The text of a file of the job directory (`path` relative to it); None when it is not there."""
        ...

    def logs(self, *, follow: bool = False, source: str = "job") -> Iterator[str]:
        """The job's log (`job`), the deployment's (`deployment`) or a task client's (a task name); with
        `follow`, new lines until the job has ended."""
        ...

    def results(self) -> InvocationResults:
        """results.json, or the results collected now (partial while the job runs)."""
        ...

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
        """Release what the handle holds (a connection, the log it writes)."""
        ...

    def __enter__(self) -> Job: ...

    def __exit__(self, *exc: object) -> None: ...


class JobHost(Protocol):
    """Where a new job goes, over one connection (opened by `JobBackend.connect`, with its checks)."""

    description: str  # where, in words: "this machine", "user@login:22"
    remote: Remote  # its filesystem and commands (staging asks it)

    def checkpoint_to_read(self, compiled: CompiledConfig) -> str | None:
        """The path of the checkpoint to describe there (None: nothing to read yet, the job prepares it)."""
        ...

    def describe_checkpoint(self, path: str, *, tokenizer: str | None, origin: str | None) -> CheckpointDescription:
        """The checkpoint at `path` there, described (small files only)."""
        ...

    def write_job_files(self, job_dir: str, files: dict[str, str]) -> None:
        """Write the job's files into its directory there."""
        ...

    def record_fields(self) -> dict[str, Any]:
        """What the invocation record keeps of this host (e.g. how to reach the cluster again)."""
        ...

    def place_results(self, record: InvocationRecord) -> None:
        """Set where this machine will hold the job's results (`record.local_results_dir`)."""
        ...

    def start(self, record: InvocationRecord, files: dict[str, str], report: Reporter) -> Job:
        """Start (or submit) the recorded job; its handle keeps the connection for following."""
        ...

    def close(self) -> None:
        """Drop the connection."""
        ...

    def __enter__(self) -> JobHost: ...

    def __exit__(self, *exc: object) -> None: ...


class JobBackend(Protocol):
    """Where jobs run: this machine, a Slurm cluster, or any registered executor's."""

    executor: str
    exports_here: bool  # True: the caller exports the results; False: the job exports them itself
    reads_remotely: bool  # reading the checkpoint or staging means contacting another machine
    staging: tuple[StagingStep, ...]  # what its machine needs before the job starts, in order (the pipeline runs them)

    @property
    def launcher(self) -> Launcher:
        """How the job script starts its steps (the registry's entry for `executor` says)."""
        ...

    def accept(self, compiled: CompiledConfig) -> None:
        """Refuse (ConfigError) a config this backend cannot run (e.g. --batch on this machine)."""
        ...

    def job_dir(self, compiled: CompiledConfig, invocation: str) -> str:
        """The job's directory (absolute, where the job runs)."""
        ...

    def toolchain(self, compiled: CompiledConfig, job_dir: str) -> Toolchain:
        """Where the job finds ckpteval's Python and the harness client."""
        ...

    def refuse_secrets(self, compiled: CompiledConfig, plan: JobPlan) -> None:
        """Refuse (ConfigError) a secret value that would be written into the job's files where it runs."""
        ...

    def preview(self, job: PlannedJob, *, check: bool = False) -> list[PreviewPanel]:
        """The panels after the compiled config: the job script, and what this backend adds."""
        ...

    def connect(self, job: PlannedJob, report: Reporter | None = None) -> JobHost:
        """Open where `job` goes; with `report` (to submit), checked there: an unknown host key, a failed login,
        a partition that does not exist end here. Without, a read-only look."""
        ...

    def describe_checkpoint(
        self, profile: Profile, path: str, *, tokenizer: str | None, origin: str | None
    ) -> CheckpointDescription:
        """The checkpoint at `path` where `profile`'s jobs run, read the way its jobs' files are reached (this
        machine's files; another machine's small files over its connection, no weights moved)."""
        ...

    def attach(self, record: InvocationRecord) -> Job:
        """The handle of a recorded invocation's job (connecting, where it must, on first use)."""
        ...

    def resume(self, record: InvocationRecord, report: Reporter) -> Job:
        """Run a stopped invocation's job again (finished tasks skipped); refused while it still runs."""
        ...


@dataclass(frozen=True)
class ScriptJob:
    """A job of one script of ours that is no invocation (a link of the cluster-hosted watcher), as the
    scheduler listed it."""

    job_id: str
    state: str  # the scheduler's word: PENDING, RUNNING, ...
    node: str = ""
    reason: str = ""  # why it waits (Dependency, Resources, ...)


class ScriptHost(Protocol):
    """Where an executor that hosts watchers runs scripts of ours outside any invocation, over one connection
    (`HostsScripts.host_scripts`): submit one with its files, list the jobs of a name, cancel or signal them."""

    description: str  # where, in words
    remote: Remote  # its filesystem and commands

    def submit(self, directory: str, files: dict[str, str], script: str, *, what: str) -> ScriptJob:
        """Write `files` into `directory` there and submit its `script` (`what` names the job in a refusal)."""
        ...

    def jobs(self, name: str) -> list[ScriptJob]:
        """The jobs named `name` that are queued, running or ending there, oldest first."""
        ...

    def cancel(self, jobs: list[ScriptJob], *, signal: str | None = None) -> None:
        """Stop them at once; with `signal` (e.g. "TERM"), send their scripts that signal to end themselves."""
        ...

    def cancel_named(self, name: str) -> None:
        """Stop every job named `name`."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> ScriptHost: ...

    def __exit__(self, *exc: object) -> None: ...


class HostsScripts(Protocol):
    """A backend whose executor hosts watchers (the registry's `hosts_watchers`)."""

    def host_scripts(self, profile: Profile) -> ScriptHost:
        """Where `profile`'s scripts run, connected (an SSH connection from the user's machine, or this machine
        where the profile says `tunnel = "local"`)."""
        ...


def task_log(record: InvocationRecord, source: str, *, exists: Callable[[str], bool] | None = None) -> str:
    """The log file (relative to the job dir) of `source`: job, deployment (the model's), a role's deployment
    (judge, model), export (vLLM/SGLang's export step), or a task (the newest started repeat of a repeated task
    when `exists` (a predicate on the relative path) is given, else its first)."""
    from ckpteval.errors import EvaluationError
    from ckpteval.invocation.jobdir import JobDir
    from ckpteval.job.roles import role_by_stem, roles

    if source == "job":
        return JobDir.JOB_LOG
    if source == "export":  # vLLM/SGLang on a Megatron checkpoint: the export step before the engine
        return JobDir.EXPORT_LOG
    task = record.task(source)
    deployed = role_by_stem(source)
    if task is None and deployed is not None:
        return deployed.log
    if task is None:
        raise EvaluationError(
            f"Invocation {record.id} has no task '{source}'.",
            hint="Choose job, deployment, export, "
            + ", ".join(r.name for r in roles() if not r.evaluated)
            + ", or one of: "
            + ", ".join(record.task_names)
            + ".",
        )
    from ckpteval.tasks.repeats import current_log, run_layouts

    rel = current_log(run_layouts(task.repeats), lambda log: exists is not None and exists(f"{task.dir}/{log}"))
    return f"{task.dir}/{rel}"


@dataclass(frozen=True)
class Placement:
    """`evaluate watch`: where one evaluation's checkpoint is served: `load_into` the kept server's load
    directory (`watch.kept`, or the executor's kept job: `JobBackend.kept_job`), or None (a fresh deployment);
    `note`: what to tell the user (why not kept this time, or a kept server started)."""

    load_into: str | None
    note: str = ""
