"""`SshBackend`: the job runs on a machine with GPUs reached over SSH, with no scheduler (a lab workstation).

The profile says how to reach it (`host`, `user`, `port`, `identity`, as for a Slurm login node), where jobs
live there (`remote_job_dir`), the Python environment that runs ckpteval's own steps and the harness client
there (`python`: no container images), its GPUs (`gpus_per_node`) and whether it reaches the hub
(`compute_internet`: if not, datasets are staged as for an offline cluster).

Submitting is the invocation pipeline's; what this backend gives it, over one connection that is reopened
if it drops (`SshHost`): the connection, checked as it opens (ckpteval importable by the profile's Python);
the checkpoint's small files; the staging of datasets (`execution.staging.stage_data`); the upload of the job
files with the harness hook and `launch.sh`; and the start: `setsid nohup bash launch.sh`, which outlives the
SSH session. `launch.sh` takes the GPUs the job needs (`execution.gpus`) by locking one file per GPU in
`/tmp/ckpteval-gpu-locks` (`flock`, held by the job's processes until the last one ends), exports them as
`CUDA_VISIBLE_DEVICES` and becomes the job script; a job that finds too few free GPUs, or the planned port of
a deployment that does not pick its own taken, does not start and says why (`state/launch`), and the
submission fails with that reason. Two invocations on one machine never share a GPU or a port.

`--run` follows the job (Ctrl-C leaves it running: the caller may cancel it); `--batch` leaves it. Later
commands re-attach it from its record (`SshPlacement`: how to reach the machine, the job's pid and its start
time, the GPUs it got): its state is the job's own state files and whether that process still runs;
`cancel` sends its process group TERM (the job script stops its tasks and deployment), then KILL; `resume`
starts it again in the same directory.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import posixpath
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from ckpteval.config.compile import CompiledConfig
from ckpteval.config.executors import Launcher, find_executor
from ckpteval.config.preview import PreviewPanel
from ckpteval.config.profiles import Profile, saved_profile
from ckpteval.errors import ClusterError, ConfigError, EvaluationError
from ckpteval.execution.backend import ExecutorView, InvocationStatus, JobEnd, task_log
from ckpteval.execution.events import Note, Reporter
from ckpteval.execution.follow import watch
from ckpteval.execution.snapshot import JobSnapshot, TaskSnapshot, settle_tasks, take_snapshot
from ckpteval.execution.staging import stage_data
from ckpteval.execution.state import State, end_state
from ckpteval.invocation.jobdir import JobDir
from ckpteval.invocation.record import FinalStatus, InvocationRecord, TaskStatus
from ckpteval.job.build import Toolchain
from ckpteval.results.model import InvocationResults

if TYPE_CHECKING:
    from ckpteval.checkpoint.description import CheckpointDescription
    from ckpteval.cluster.remote import Remote
    from ckpteval.cluster.session import ClusterSession
    from ckpteval.execution.planned import PlannedJob
    from ckpteval.job.plan import JobPlan

LAUNCH_SCRIPT = "launch.sh"
LAUNCH_STATE = "state/launch"  # "started PID START GPUS" or "refused WHY", written by launch.sh
LOCK_DIR = "/tmp/ckpteval-gpu-locks"  # one lock file per GPU of the machine, shared by every user's jobs
REFUSED_EXIT = 75  # launch.sh's exit code when it does not start the job
START_WAIT_S = 30.0  # how long `start` waits for launch.sh to say whether the job started
CANCEL_GRACE_S = 30.0  # seconds the job's processes get to end on TERM before KILL
FOLLOW_INTERVAL_S = 2.0
LOG_TAIL_LINES = 30


@dataclass
class SshPlacement:
    """The ssh executor's part of an invocation record."""

    connection: dict[str, Any]  # the profile at submission (secrets redacted): how to reach the machine
    pid: int | None = None  # the job's process (its process group's leader), latest attempt
    start: str | None = None  # that process's start time there (a reused pid has another)
    gpus: str = ""  # the CUDA_VISIBLE_DEVICES it got
    refused: str = ""  # why the latest attempt did not start

    @property
    def attempt(self) -> str | None:
        """The latest attempt's identity (pid and start time), the key of a status kept in the record."""
        return f"{self.pid}@{self.start}" if self.pid else None


def placement_of(record: InvocationRecord) -> SshPlacement:
    found = record.placement_as(SshPlacement)
    if found is None:
        raise ClusterError(f"Invocation {record.id} does not say how to reach its machine (no placement recorded).")
    return found


def record_profile(record: InvocationRecord) -> Profile:
    """The profile the invocation was submitted with (how to reach its machine)."""
    return saved_profile(placement_of(record).connection, executor="ssh")


def render_launch_script(plan: JobPlan, *, invocation: str, gpus: int, machine_gpus: int) -> str:
    """The script that starts `job.sh` detached on the machine: GPUs locked for it, its port checked free.

    The lock files are opened read-only (any user can lock a file another user made), one per GPU; each lock
    is held by the open descriptor, which the job script and everything it starts inherit (`exec`), so a
    GPU stays taken until the job's last process has ended."""
    port = ""
    deployment = plan.deployment
    if deployment.step is not None and deployment.port_file is None and deployment.health_url:
        port = str(urlparse(deployment.health_url).port or "")  # a deployment that does not pick its own port
    q = shlex.quote
    return f"""#!/usr/bin/env bash
# ckpteval: start the job of invocation {invocation} on this machine, detached, on GPUs of its own.
cd "$(dirname "$0")" || exit 1
mkdir -p logs state
refuse() {{ echo "refused $*" > {LAUNCH_STATE}.tmp && mv {LAUNCH_STATE}.tmp {LAUNCH_STATE}; exit {REFUSED_EXIT}; }}
WANT={int(gpus)}
HAVE={int(machine_gpus)}
LOCKS={q(LOCK_DIR)}
PORT={q(port)}
mkdir -p "$LOCKS" 2>/dev/null && chmod 1777 "$LOCKS" 2>/dev/null
GOT=()
for ((i = 0; i < HAVE && ${{#GOT[@]}} < WANT; i++)); do
  [ -e "$LOCKS/gpu$i" ] || : 2>/dev/null > "$LOCKS/gpu$i"
  [ -r "$LOCKS/gpu$i" ] || continue
  exec {{fd}}<"$LOCKS/gpu$i"
  if flock -n "$fd"; then
    GOT+=("$i")
    echo {q(invocation)} > "$LOCKS/gpu$i.owner" 2>/dev/null
  else
    exec {{fd}}<&-
  fi
done
if [ "${{#GOT[@]}}" -lt "$WANT" ]; then
  busy=""
  for ((i = 0; i < HAVE; i++)); do
    case " ${{GOT[*]}} " in *" $i "*) continue ;; esac
    busy="$busy $i:$(cat "$LOCKS/gpu$i.owner" 2>/dev/null || echo '?')"
  done
  refuse "$WANT GPU(s) wanted, ${{#GOT[@]}} of $HAVE free; GPU:invocation busy:$busy"
fi
if [ -n "$PORT" ] && (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
  refuse "port $PORT is taken on this machine (another deployment?)"
fi
export CUDA_VISIBLE_DEVICES="$(IFS=,; echo "${{GOT[*]}}")"
START=$(awk '{{print $22}}' /proc/$$/stat)
echo "started $$ $START ${{CUDA_VISIBLE_DEVICES:--}}" > {LAUNCH_STATE}.tmp && mv {LAUNCH_STATE}.tmp {LAUNCH_STATE}
exec bash {JobDir.SCRIPT} >> {JobDir.JOB_LOG} 2>&1 < /dev/null
"""


def ssh_toolchain(python: str, job_dir: str) -> Toolchain:
    """The machine: the profile's Python (the builtin deployment, the job's own scripts), the nemo-evaluator
    beside it, and the harness hook uploaded into the job directory."""
    bin_dir = posixpath.dirname(python)
    evaluator = posixpath.join(bin_dir, "nemo-evaluator") if bin_dir else "nemo-evaluator"
    return Toolchain(python=python, evaluator=evaluator, hook_dir=f"{job_dir}/{JobDir.HOOK}", script_python=python)


def _session(profile: Profile, report: Reporter | None) -> ClusterSession:
    from ckpteval.cluster.session import ClusterSession

    warn = (lambda m: report(Note(m, "warning"))) if report is not None else None
    return ClusterSession(profile, on_reconnect=warn)


class SshHost:
    """The machine, as where a new job goes: one connection (reopened if it drops), checked as it opens."""

    def __init__(self, job: PlannedJob, report: Reporter | None) -> None:
        self.job = job
        self.compiled = job.compiled
        self.profile: Profile = job.profile
        self.session = _session(self.profile, report)
        if report is None:
            return  # a read-only look (the checkpoint, for a dry run with --check)
        from ckpteval.cluster.preflight import check_builtin_python

        try:
            remote = self.session.remote  # unknown host key, failed login, unreachable host end here
            report(Note(f"connected to {remote.description}"))
            check_builtin_python(remote, job.plan, self.profile)
        except BaseException:
            self.session.close()
            raise

    @property
    def remote(self) -> Remote:
        return self.session.remote

    @property
    def description(self) -> str:
        return self.session.remote.description

    def __enter__(self) -> SshHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def checkpoint_to_read(self, compiled: CompiledConfig) -> str | None:
        """The checkpoint's path there; None for a packaged model the job prepares."""
        deployment = compiled.config.deployment
        path = getattr(deployment, "checkpoint_path", None)
        if not path or getattr(deployment, "prepare", None):
            return None
        return str(path)

    def describe_checkpoint(self, path: str, *, tokenizer: str | None, origin: str | None) -> CheckpointDescription:
        from ckpteval.cluster.checkpoint_files import describe_remote_checkpoint

        return self.session.call(
            lambda remote: describe_remote_checkpoint(remote, path, tokenizer=tokenizer, origin=origin)
        )

    def write_job_files(self, job_dir: str, files: dict[str, str]) -> None:
        """Upload them, the harness hook and `launch.sh` to the job directory there."""
        from ckpteval.cluster.submission import local_hook_dir, upload_job_files

        execution = self.compiled.config.execution
        launch = render_launch_script(
            self.job.plan,
            invocation=self.job.invocation,
            gpus=getattr(execution, "gpus", 0),
            machine_gpus=getattr(execution, "machine_gpus", 0),
        )
        upload_job_files(self.remote, job_dir, files, local_hook_dir())
        self.remote.write_text_atomic(JobDir(job_dir).join(LAUNCH_SCRIPT), launch, mode=0o755)

    def record_fields(self) -> dict[str, Any]:
        """How to reach the machine again (secrets redacted)."""
        connection = self.compiled.secrets.redact_data(self.profile.to_config())
        return {"placement": SshPlacement(connection=connection)}

    def place_results(self, record: InvocationRecord) -> None:
        record.local_results_dir = str(local_job_copy(record))  # fetched there when the job has ended

    def start(self, record: InvocationRecord, files: dict[str, str], report: Reporter) -> SshJob:
        launch(self.session, record, report)
        return SshJob(record, self.session)

    def close(self) -> None:
        self.session.close()


def local_job_copy(record: InvocationRecord) -> Path:
    """Where the job directory's result files are fetched to: `<record dir>/job`."""
    return record.path / "job"


def launch(session: ClusterSession, record: InvocationRecord, report: Reporter) -> None:
    """Start `launch.sh` there, detached from this SSH session (setsid, nohup, no terminal), and wait until it
    says whether the job started; ClusterError with its reason when it did not."""
    placement = placement_of(record)
    job_dir = JobDir(record.job_dir)
    state = job_dir.join(LAUNCH_STATE)
    command = (
        f"cd {shlex.quote(record.job_dir)} && rm -f {LAUNCH_STATE} && "
        f"(setsid nohup bash {LAUNCH_SCRIPT} > logs/launch.log 2>&1 < /dev/null &)"
    )
    report(Note(f"starting the job on {session.description} ..."))
    session.call(lambda r: r.run(["bash", "-c", command], timeout=60))
    deadline = time.monotonic() + START_WAIT_S
    said = None
    while time.monotonic() < deadline:
        said = session.call(lambda r: r.read_text_if_exists(state))
        if said:
            break
        time.sleep(0.3)
    word, _, rest = (said or "").strip().partition(" ")
    if word != "started":
        placement.refused = rest or "launch.sh did not say whether it started the job (see logs/launch.log)"
        placement.pid = None
        record.job_label = "not started"
        record.save()
        raise ClusterError(
            f"The job of invocation {record.id} did not start on {session.description}: {placement.refused}.",
            hint="Wait for the other invocations there to end, or ask for fewer GPUs (execution.gpus=N).",
        )
    pid, start, gpus = [*rest.split(), "", "", ""][:3]
    placement.pid, placement.start = int(pid), start
    placement.gpus = "" if gpus == "-" else gpus
    placement.refused = ""
    record.job_label = f"process {pid} on {placement.connection.get('host')}"
    record.final = None  # a new attempt: its status is asked again
    (local_job_copy(record) / JobDir.RESULTS).unlink(missing_ok=True)  # an earlier attempt's
    record.save()
    report(Note(f"job started: {record.job_label}" + (f", GPUs {placement.gpus}" if placement.gpus else "")))


class SshJob:
    """The job of one invocation on the machine: followed over the connection that started it, or re-attached
    from its record (`SshBackend.attach`), connecting on first use."""

    exports_here = False  # the job exports its own results as it ends (the pipeline adds the export step)
    runs_detached = True

    def __init__(self, record: InvocationRecord, session: ClusterSession | None = None) -> None:
        self.record = record
        self._session = session

    @property
    def session(self) -> ClusterSession:
        if self._session is None:
            self._session = _session(record_profile(self.record), None)
        return self._session

    def __enter__(self) -> SshJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def alive(self) -> bool:
        """Whether the job's process still runs there (its pid, started when the job did)."""
        placement = placement_of(self.record)
        if not placement.pid:
            return False
        result = self.session.call(
            lambda r: r.run(["awk", "{print $22}", f"/proc/{placement.pid}/stat"], check=False, timeout=30)
        )
        return result.ok and result.stdout.strip() == placement.start

    def _view(self) -> Any:
        from ckpteval.cluster.jobview import RemoteJobView

        view = RemoteJobView(self.session, self.record.job_dir)
        view.prefetch(JobDir.state_dirs([(t.name, t.dir, t.repeats) for t in self.record.tasks]))
        return view

    def follow(self, report: Reporter) -> None:
        from ckpteval.cluster.jobview import LogTail
        from ckpteval.execution.events import LogLines
        from ckpteval.tasks.progress import progress_reader

        record = self.record
        report(Note(f"following invocation {record.id} (Ctrl-C to detach or cancel)", "notice"))
        log = LogTail(self.session, JobDir(record.job_dir).join(JobDir.JOB_LOG))
        view = self._view()
        dirs = JobDir.state_dirs([(t.name, t.dir, t.repeats) for t in record.tasks])
        watch(
            view,
            record.task_dirs,
            is_running=self.alive,
            report=report,
            progress=progress_reader,
            interval=FOLLOW_INTERVAL_S,
            new_log_lines=log.read,
            before_snapshot=lambda: view.prefetch(dirs),
        )
        rest = log.read(final=True)
        if rest:
            report(LogLines(tuple(rest)))

    def interrupt(self) -> bool:
        """Ctrl-C leaves the job running there."""
        return False

    def collect(self) -> InvocationResults:
        return self._fetch(final=True)

    def end(self, results: InvocationResults) -> JobEnd:
        status = self.status()
        if status.state == "succeeded" and results.status == "succeeded":
            return JobEnd("succeeded")
        state = "failed" if status.state == "succeeded" else status.state
        return JobEnd(state, f"the job ended {status.state}; last lines of its log:", self._log_tail())

    def status(self) -> InvocationStatus:
        """The job's state files and whether its process runs, in one connection; an ended job's status is
        kept in the record (listing old invocations does not connect again)."""
        record = self.record
        placement = placement_of(record)
        if not placement.pid:
            why = placement.refused or "it was never started"
            return InvocationStatus(record=record, state="failed", snapshot=None, detail=f"not started: {why}")
        final = record.final
        if final is not None and final.job == placement.attempt:
            return _remembered(record, final, self._executor_view())
        from ckpteval.tasks.progress import progress_reader

        running = self.alive()  # first: a job that ends in between is read as ended (it writes its code first)
        snapshot = take_snapshot(self._view(), record.task_dirs, progress_reader)
        state = end_state(snapshot.finished)
        detail = "" if state in (None, "succeeded") else f"exit {snapshot.finished}"
        if state is None:
            state = ("running" if snapshot.started else "pending") if running else "cancelled"
        tail = self._log_tail() if state == "failed" else ""
        status = InvocationStatus(
            record=record,
            state=state,
            snapshot=settle_tasks(snapshot, running, state),
            detail=detail,
            executor_view=self._executor_view(),
            log_tail=tail,
        )
        if state in ("succeeded", "failed", "cancelled"):
            _remember(status, placement.attempt)
        return status

    def _executor_view(self) -> ExecutorView:
        placement = placement_of(self.record)
        host = str(placement.connection.get("host"))
        gpus = f" (GPUs {placement.gpus})" if placement.gpus else ""
        return ExecutorView(
            label=f"pid {placement.pid} on {host}{gpus}",
            fields={"pid": str(placement.pid), "host": host, "gpus": placement.gpus or None},
        )

    def state(self) -> State:
        return self.status().state

    def read(self, path: str) -> str | None:
        full = JobDir(self.record.job_dir).join(path)
        return self.session.call(lambda r: r.read_text_if_exists(full))

    def cancel(self) -> str:
        """TERM to the job's process group (its trap stops the tasks and the deployment), KILL if it lingers."""
        record = self.record
        placement = placement_of(record)
        if not self.alive():
            return f"invocation {record.id} is not running"
        group = f"-{placement.pid}"
        self.session.call(lambda r: r.run(["kill", "-TERM", "--", group], check=False, timeout=30))
        deadline = time.monotonic() + CANCEL_GRACE_S
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        if self.alive():
            self.session.call(lambda r: r.run(["kill", "-KILL", "--", group], check=False, timeout=30))
        return f"cancelled invocation {record.id} ({record.job_label})"

    def logs(self, *, follow: bool = False, source: str = "job") -> Iterator[str]:
        from ckpteval.cluster.jobview import LogTail

        record = self.record
        job_dir = JobDir(record.job_dir)
        exists = lambda rel: self.session.call(lambda r: r.exists(job_dir.join(rel)))  # noqa: E731
        tail = LogTail(self.session, job_dir.join(task_log(record, source, exists=exists)))
        while True:
            yield from tail.read()
            if not follow or not self.alive():
                yield from tail.read(final=True)
                return
            time.sleep(1.0)

    def results(self) -> InvocationResults:
        """results.json fetched before, or fetched now (partial while the job still runs)."""
        from ckpteval.results.store import read_results

        local = local_job_copy(self.record) / JobDir.RESULTS
        if local.is_file() and self.record.local_results_dir:
            return read_results(local)
        if not placement_of(self.record).pid:
            raise EvaluationError(f"Invocation {self.record.id} never started: it has no results.")
        return self._fetch(final=not self.alive())

    def _fetch(self, *, final: bool) -> InvocationResults:
        """Fetch the job directory's result files and collect them (written to results.json, here and there,
        when `final`)."""
        from ckpteval.cluster.fetch import fetch_job_dir
        from ckpteval.results.collect import collect_results
        from ckpteval.results.store import write_results

        record = self.record
        local = local_job_copy(record)
        self.session.call(lambda r: fetch_job_dir(r, record.job_dir, local))
        results = collect_results(
            local,
            record.task_dirs,
            invocation=record.id,
            created=record.created,
            model=record.model,
            label=record.label,
        )
        if final:
            text = write_results(local, results).read_text(encoding="utf-8")
            self.session.call(lambda r: r.write_text_atomic(JobDir(record.job_dir).join(JobDir.RESULTS), text))
            record.local_results_dir = str(local)
            record.save()
        return results

    def _log_tail(self) -> str:
        text = self.read(JobDir.JOB_LOG) or self.read("logs/launch.log") or ""
        return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])

    def close(self) -> None:
        if self._session is not None:
            self._session.close()


def _remember(status: InvocationStatus, attempt: str | None) -> None:
    record, snapshot = status.record, status.snapshot
    assert snapshot is not None
    record.final = FinalStatus(
        job=attempt,
        state=status.state,
        detail=status.detail,
        log_tail=status.log_tail,
        deployment=snapshot.deployment,
        finished=snapshot.finished,
        tasks=[TaskStatus(**dataclasses.asdict(t)) for t in snapshot.tasks],
        ended=snapshot.ended,
    )
    record.save()


def _remembered(record: InvocationRecord, final: FinalStatus, view: ExecutorView) -> InvocationStatus:
    tasks = tuple(TaskSnapshot(**dataclasses.asdict(t)) for t in final.tasks)
    snapshot = JobSnapshot(deployment=final.deployment, tasks=tasks, finished=final.finished, ended=final.ended)
    return InvocationStatus(
        record=record,
        state=final.state,  # type: ignore[arg-type]
        snapshot=snapshot,
        detail=final.detail,
        executor_view=view,
        log_tail=final.log_tail,
    )


@dataclass
class SshBackend:
    """Jobs on a machine reached over SSH, with no scheduler."""

    executor: str = "ssh"
    exports_here: bool = False  # the job exports its own results as it ends (the pipeline adds the export step)
    reads_remotely: bool = True
    staging: tuple[Any, ...] = field(default=(stage_data,))  # datasets of an offline machine; no images

    @property
    def launcher(self) -> Launcher:
        return find_executor(self.executor).launcher

    def accept(self, compiled: CompiledConfig) -> None:
        """Both --run (followed) and --batch (left running) are fine: the job outlives the SSH session."""

    def job_dir(self, compiled: CompiledConfig, invocation: str) -> str:
        return posixpath.join(posixpath.normpath(compiled.config.execution.output_dir), invocation)

    def toolchain(self, compiled: CompiledConfig, job_dir: str) -> Toolchain:
        return ssh_toolchain(compiled.profile.part.step_python(), job_dir)

    def refuse_secrets(self, compiled: CompiledConfig, plan: JobPlan) -> None:
        from ckpteval.cluster.submission import check_no_secrets

        check_no_secrets(compiled, plan)

    def preview(self, job: PlannedJob, *, check: bool = False) -> list[PreviewPanel]:
        """The job script and the launch script that starts it there."""
        from ckpteval.job.files import job_files
        from ckpteval.job.request_groups import request_groups_panel

        execution = job.compiled.config.execution
        files = job_files(job.compiled, job.plan, launcher=self.launcher)
        launch_script = render_launch_script(
            job.plan,
            invocation=job.invocation,
            gpus=getattr(execution, "gpus", 0),
            machine_gpus=getattr(execution, "machine_gpus", 0),
        )
        requests = request_groups_panel(job.plan)
        return [
            PreviewPanel(
                title=f"launch script ({JobDir(job.job_dir).join(LAUNCH_SCRIPT)})", body=launch_script, language="bash"
            ),
            PreviewPanel(
                title=f"job script ({JobDir(job.job_dir).join(JobDir.SCRIPT)})",
                body=files[JobDir.SCRIPT],
                language="bash",
                full_only_in_dry_run=True,
            ),
            *([requests] if requests else []),
        ]

    def connect(self, job: PlannedJob, report: Reporter | None = None) -> SshHost:
        return SshHost(job, report)

    def describe_checkpoint(
        self, profile: Profile, path: str, *, tokenizer: str | None, origin: str | None
    ) -> CheckpointDescription:
        """Its small files over the profile's SSH, in one round trip."""
        from ckpteval.cluster.checkpoint_files import describe_at

        return describe_at(profile, path, tokenizer=tokenizer, origin=origin)

    def attach(self, record: InvocationRecord) -> SshJob:
        return SshJob(record)

    def resume(self, record: InvocationRecord, report: Reporter) -> SshJob:
        """Start the job again in its directory (finished tasks skipped); refused while it still runs."""
        job = SshJob(record, _session(record_profile(record), report))
        try:
            if job.alive():
                raise ConfigError(
                    f"Invocation {record.id} is still running ({record.job_label}).",
                    hint=f"Wait for it, or `evaluate cancel {record.id}` first.",
                )
            script = JobDir(record.job_dir).join(LAUNCH_SCRIPT)
            if not job.session.call(lambda r: r.exists(script)):
                raise ClusterError(
                    f"The job directory of invocation {record.id} is gone: {record.job_dir}.",
                    hint="Run the `evaluate` command again to start over.",
                )
            launch(job.session, record, report)
        except BaseException:
            job.close()
            raise
        return job
