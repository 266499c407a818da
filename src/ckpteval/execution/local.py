"""`LocalBackend`: the job runs on this machine, as a plain process group.

The job is the same bash script a Slurm allocation runs, started as a plain process in its own session
rather than through nemo-run's LocalExecutor: importing nemo_run costs ~12 s here, and the script
already does what an executor would (one process tree, logs, exit code) — so a plain process is
simpler and faster. It is a child of the calling process (there is no detached local run): Ctrl-C stops
it (and with it the deployment) and keeps finished tasks; `resume` runs it again where it stopped.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ckpteval.config.compile import CompiledConfig
from ckpteval.config.executors import Launcher, find_executor
from ckpteval.config.preview import PreviewPanel
from ckpteval.errors import ConfigError, EvaluationError
from ckpteval.execution.backend import InvocationStatus, JobEnd, task_log
from ckpteval.execution.events import Reporter
from ckpteval.execution.follow import watch
from ckpteval.execution.processes import process_start_time
from ckpteval.execution.snapshot import LocalJobView, settle_tasks, take_snapshot
from ckpteval.execution.state import State, end_state
from ckpteval.invocation.jobdir import JobDir
from ckpteval.invocation.record import InvocationRecord
from ckpteval.job.build import Toolchain, local_toolchain
from ckpteval.job.files import job_files, write_job_files
from ckpteval.results.model import InvocationResults

if TYPE_CHECKING:
    from ckpteval.checkpoint.description import CheckpointDescription
    from ckpteval.config.profiles import Profile
    from ckpteval.execution.planned import PlannedJob
    from ckpteval.job.plan import JobPlan

LOG_TAIL_LINES = 40


@dataclass
class LocalProcess:
    """The local executor's part of an invocation record: the job's process group, its pid and the pid's
    start time (a reused pid has another)."""

    pid: int
    start: str | None = None


def process_of(record: InvocationRecord) -> LocalProcess | None:
    """The recorded process of a local job (None: never started)."""
    return record.placement_as(LocalProcess)


DEPLOYMENT_FAILED = 3  # the job script's exit code when the deployment never became healthy


def local_job_dir(compiled: CompiledConfig, invocation: str) -> Path:
    """`<execution.output_dir>/<invocation>` as an absolute path (relative output dirs are per cwd)."""
    base = Path(compiled.config.execution.output_dir).expanduser()
    if not base.is_absolute():
        base = compiled.request.cwd / base
    return base.resolve() / invocation


class LocalHost:
    """This machine, as where a new job goes: its files written here, the job started as a child process."""

    description = "this machine"

    def __init__(self) -> None:
        from ckpteval.cluster.remote import LocalRemote

        self.remote = LocalRemote()

    def __enter__(self) -> LocalHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def checkpoint_to_read(self, compiled: CompiledConfig) -> str | None:
        """The checkpoint's absolute path (relative ones are per cwd); None while the job is still to prepare it."""
        deployment = compiled.config.deployment
        path = getattr(deployment, "checkpoint_path", None)
        if not path:
            return None
        checkpoint = Path(path).expanduser()
        checkpoint = checkpoint if checkpoint.is_absolute() else compiled.request.cwd / checkpoint
        if getattr(deployment, "prepare", None) and not checkpoint.exists():
            return None
        return str(checkpoint)

    def describe_checkpoint(self, path: str, *, tokenizer: str | None, origin: str | None) -> CheckpointDescription:
        from ckpteval.checkpoint.description import describe_checkpoint

        return describe_checkpoint(Path(path), tokenizer=tokenizer, origin=origin)

    def write_job_files(self, job_dir: str, files: dict[str, str]) -> None:
        write_job_files(Path(job_dir), files)

    def record_fields(self) -> dict[str, Any]:
        return {}

    def place_results(self, record: InvocationRecord) -> None:
        record.local_results_dir = record.job_dir  # the job writes them here

    def start(self, record: InvocationRecord, files: dict[str, str], report: Reporter) -> LocalJob:
        return LocalJob.start(record)

    def close(self) -> None:
        self.remote.close()


@dataclass
class LocalJob:
    """The job's process group on this machine: started here (`proc`, the log it writes), or re-attached
    from its record (`LocalBackend.attach`: the recorded pid, checked against its start time)."""

    record: InvocationRecord
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    exports_here: bool = True
    runs_detached: bool = False
    stopped: bool = field(default=False)

    @classmethod
    def start(cls, record: InvocationRecord) -> LocalJob:
        """`bash job.sh` in the job dir, in its own session (so it can be stopped as a whole), output to its log."""
        job_dir = JobDir(record.job_dir)
        job_dir.path(JobDir.LOGS).mkdir(exist_ok=True)
        log = open(job_dir.path(JobDir.JOB_LOG), "ab")  # noqa: SIM115 (closed by close(), after the job)
        proc = subprocess.Popen(
            ["bash", str(job_dir.path(JobDir.SCRIPT))],
            cwd=job_dir.path(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        record.placement = LocalProcess(pid=proc.pid, start=process_start_time(proc.pid))
        record.job_label = f"process group {proc.pid}"
        record.save()
        return cls(record=record, proc=proc, log=log)

    def __enter__(self) -> LocalJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def running(self) -> bool:
        """Whether the job's script still runs (its child here, or its recorded process)."""
        if self.proc is not None:
            return self.proc.poll() is None
        return job_process_alive(self.record)

    def follow(self, report: Reporter) -> None:
        from ckpteval.tasks.progress import progress_reader

        view = LocalJobView(Path(self.record.job_dir))
        watch(view, self.record.task_dirs, is_running=self.running, report=report, progress=progress_reader)

    def end(self, results: InvocationResults) -> JobEnd:
        if self.proc is None:  # re-attached: the job's own exit code, from its state files
            return JobEnd(self.state())
        code = self.proc.wait()
        state = end_state(code) or "failed"
        if code == DEPLOYMENT_FAILED:
            return JobEnd(state, "the job failed; last lines of its log:", _tail(self.record, LOG_TAIL_LINES))
        return JobEnd(state)

    def interrupt(self) -> bool:
        """Ctrl-C stops the job here (its trap stops the deployment); finished tasks keep their results."""
        if self.proc is None:
            self.cancel()
        else:
            _stop(self.proc)
        self.stopped = True
        return True

    def collect(self) -> InvocationResults:
        return collect_here(self.record)

    def status(self) -> InvocationStatus:
        from ckpteval.tasks.progress import progress_reader

        record = self.record
        # liveness first, then the state files: the job writes its exit code before it exits, so a job that
        # ends in between is read as ended, never as "not running, no exit code" (stopped from outside)
        running = job_process_alive(record)
        snapshot = take_snapshot(LocalJobView(Path(record.job_dir)), record.task_dirs, progress_reader)
        state = end_state(snapshot.finished)
        if state is None:
            # no exit code recorded: running, or stopped from outside
            state = ("running" if snapshot.started else "pending") if running else "cancelled"
        # a job stopped under its tasks (cancel, Ctrl-C) leaves them `running`: settled as on Slurm
        return InvocationStatus(record=record, state=state, snapshot=settle_tasks(snapshot, running, state))

    def state(self) -> State:
        return self.status().state

    def read(self, path: str) -> str | None:
        file = JobDir(self.record.job_dir).path(path)
        return file.read_text(encoding="utf-8", errors="replace") if file.is_file() else None

    def logs(self, *, follow: bool = False, source: str = "job") -> Iterator[str]:
        job_dir = JobDir(self.record.job_dir)
        path = job_dir.path(task_log(self.record, source, exists=lambda rel: job_dir.path(rel).exists()))
        pos = 0
        while True:
            if path.exists():
                with path.open("r", encoding="utf-8", errors="replace") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
                    pos = fh.tell()
                yield from chunk.splitlines()
            if not follow or self.state() not in ("running", "pending"):
                if follow and path.exists():  # drain what was written after the last read
                    with path.open("r", encoding="utf-8", errors="replace") as fh:
                        fh.seek(pos)
                        yield from fh.read().splitlines()
                return
            time.sleep(0.5)

    def cancel(self) -> str:
        record = self.record
        process = process_of(record)
        if not job_process_alive(record) or process is None:
            return f"invocation {record.id} is not running"
        pid = process.pid
        os.killpg(pid, signal.SIGTERM)  # the job's trap stops the deployment
        for _ in range(100):
            if not job_process_alive(record):
                break
            time.sleep(0.2)
        # the job's script has ended; what it started in its process group may still be shutting down (the
        # harness's adapter server runs its post-evaluation hooks on SIGTERM): wait for it, then end it
        deadline = time.monotonic() + CANCEL_GRACE_S
        while process_group_members(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if process_group_members(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            for _ in range(25):
                if not process_group_members(pid):
                    break
                time.sleep(0.2)
        return f"cancelled invocation {record.id} (process group {pid})"

    def results(self) -> InvocationResults:
        from ckpteval.results.collect import collect_results
        from ckpteval.results.store import read_results

        record = self.record
        job_dir = JobDir(record.job_dir)
        path = job_dir.path(JobDir.RESULTS)
        if path.exists():
            return read_results(path)
        if not job_dir.path().exists():
            raise EvaluationError(f"The job directory of invocation {record.id} is gone: {job_dir.root}.")
        if job_dir.path(JobDir.FINISHED).exists() and not job_process_alive(record):
            return collect_here(record)  # ended, and nobody followed it (e.g. evaluate watch): write results.json
        return collect_results(  # still running: partial, and not written
            job_dir.path(), record.task_dirs, invocation=record.id, created=record.created, model=None
        )

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


class LocalBackend:
    """Jobs on this machine."""

    executor = "local"

    @property
    def launcher(self) -> Launcher:
        """How this executor's job scripts start their steps, as the registry says."""
        return find_executor(self.executor).launcher

    exports_here = True  # the caller exports the results once the job has ended
    reads_remotely = False
    staging = ()  # its files, checkpoint and datasets are here already

    def accept(self, compiled: CompiledConfig) -> None:
        if compiled.mode == "batch":
            # a local job is a child of this process (Ctrl-C stops it): there is no detached local run
            name = compiled.profile.name
            raise ConfigError(
                f"--batch submits to a cluster and returns; profile [{name}] runs on this machine.",
                hint=f"Use --run {name} (or neither flag) to run here, attached; or --batch with a Slurm profile.",
            )

    def job_dir(self, compiled: CompiledConfig, invocation: str) -> str:
        return str(local_job_dir(compiled, invocation))

    def toolchain(self, compiled: CompiledConfig, job_dir: str) -> Toolchain:
        return local_toolchain()

    def refuse_secrets(self, compiled: CompiledConfig, plan: JobPlan) -> None:
        """Nothing to refuse: the job's files stay on this machine, and secret values are redacted in them."""

    def preview(self, job: PlannedJob, *, check: bool = False) -> list[PreviewPanel]:
        """The job script, and how the tasks' requests go (nothing to squash here)."""
        from ckpteval.job.request_groups import request_groups_panel

        files = job_files(job.compiled, job.plan, launcher=self.launcher)
        requests = request_groups_panel(job.plan)
        return [
            PreviewPanel(
                title=f"job script {JobDir(job.job_dir).join(JobDir.SCRIPT)}",
                body=files[JobDir.SCRIPT],
                language="bash",
                full_only_in_dry_run=True,
            ),
            *([requests] if requests else []),
        ]

    def connect(self, job: PlannedJob, report: Reporter | None = None) -> LocalHost:
        return LocalHost()

    def describe_checkpoint(
        self, profile: Profile, path: str, *, tokenizer: str | None, origin: str | None
    ) -> CheckpointDescription:
        """The checkpoint on this machine."""
        from ckpteval.checkpoint.description import describe_checkpoint

        return describe_checkpoint(Path(path), tokenizer=tokenizer, origin=origin)

    def attach(self, record: InvocationRecord) -> LocalJob:
        return LocalJob(record)

    def resume(self, record: InvocationRecord, report: Reporter) -> LocalJob:
        """Run the job again in its job directory (always followed: it is a child of this process).

        Tasks marked done are skipped; the interrupted task's harness replays its cached responses, so only
        the requests it had not answered reach the model.
        """
        if job_process_alive(record):
            process = process_of(record)
            assert process is not None
            raise ConfigError(
                f"Invocation {record.id} is still running (process group {process.pid}).",
                hint=f"Wait for it, or `evaluate cancel {record.id}` first.",
            )
        job_dir = JobDir(record.job_dir)
        if not job_dir.path(JobDir.SCRIPT).is_file():
            raise ConfigError(
                f"The job directory of invocation {record.id} is gone: {job_dir.root}.",
                hint="Run the `evaluate` command again to start over.",
            )
        return LocalJob.start(record)


def collect_here(record: InvocationRecord) -> InvocationResults:
    """The results of a local job from its task dirs, written to its results.json."""
    from ckpteval.results.collect import collect_results
    from ckpteval.results.store import write_results

    job_dir = JobDir(record.job_dir).path()
    results = collect_results(
        job_dir, record.task_dirs, invocation=record.id, created=record.created, model=record.model, label=record.label
    )
    write_results(job_dir, results)
    return results


CANCEL_GRACE_S = 20.0  # seconds a cancelled job's processes get to end on SIGTERM before SIGKILL


def process_group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (a job's: its script and every task it started)."""
    members = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(proc.name))
    return members


def job_process_alive(record: InvocationRecord) -> bool:
    """Whether the local job's process still runs: its recorded pid is alive AND started when the job did.

    A bare pid is not enough: after the job ends (or the machine reboots) the number can be reused by an
    unrelated process, which `status` would report as running and `cancel` would signal.
    """
    process = process_of(record)
    if process is None:
        return False
    pid = process.pid
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, someone else's: the start time decides
    now = process_start_time(int(pid))
    started = process.start
    return now is not None and (started is None or now == started)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the job's process group (its trap stops the deployment); SIGKILL if it lingers."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=90)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tail(record: InvocationRecord, lines: int) -> str:
    path = JobDir(record.job_dir).path(JobDir.JOB_LOG)
    text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
    return "\n".join(text)
