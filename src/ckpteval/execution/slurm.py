"""`SlurmBackend`: the job runs as one Slurm job on a cluster, submitted with nemo-run over SSH.

Submitting is the invocation pipeline's (`ckpteval.execution.pipeline`); what this backend gives it,
over one connection that is reopened if it drops (`SlurmHost`):
1. the connection, checked as it opens (a clear error for an unknown host key, failed login, unreachable
   host; the partition and account against the cluster, before the slow nemo-run import; the job's Python);
2. the checkpoint's small files over SSH, the cluster's filesystem for staging (images squashed with
   `enroot import` in a compute step, datasets, the W&B key), and the refusal of any secret value in the
   job's files;
3. the upload of the job files, with the harness's offline-data hook, to `<output_dir>/<invocation>/`
   (`ckpteval.cluster.submission`);
4. once the pipeline has recorded the invocation, the submission through nemo-run (`SlurmExecutor`, see
   `ckpteval.cluster.sbatch` for the shape of the job).

Following (`SlurmJob.follow`): the job's state files and log, read in one round trip per tick, and a
note whenever Slurm's view changes (pending with its reason, running). Ctrl-C leaves the job running:
whether to cancel it is the caller's question. When it has ended, the result files are fetched into
`<record dir>/job/` and `results.json` written there and on the cluster.

Later commands (status, logs, cancel, results) re-attach the job's handle from its record (`attach`); it
opens one connection on first use: squeue/sacct for Slurm's view, the job's state files for ours, `scancel`
to stop it. Nothing but `submit` imports nemo-run. A
cancelled, preempted or timed-out job is resubmitted by `resume`: the same job script in the same
directory, which skips finished tasks and replays cached responses of the interrupted one.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import posixpath
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ckpteval.cluster.jobview import LogTail, RemoteJobView
from ckpteval.cluster.remote import Remote
from ckpteval.cluster.sbatch import SbatchSpec, render_sbatch_preview
from ckpteval.cluster.session import ClusterSession
from ckpteval.cluster.slurm import ClusterFacts, SlurmJobState, cancel_job, job_state
from ckpteval.cluster.submission import (
    check_no_secrets,
    local_hook_dir,
    remote_job_dir,
    sbatch_spec,
    upload_job_files,
    with_images,
)
from ckpteval.config.compile import CompiledConfig
from ckpteval.config.executors import Launcher, find_executor
from ckpteval.config.preview import PreviewPanel
from ckpteval.config.profiles import Profile
from ckpteval.errors import ClusterError, ConfigError, EvaluationError
from ckpteval.execution.backend import InvocationStatus, JobEnd, ScriptJob, task_log
from ckpteval.execution.events import Note, Reporter
from ckpteval.execution.follow import watch
from ckpteval.execution.slurm_state import (
    SlurmSubmission,
    combine_state,
    fetch_results,
    kept_step_output,
    local_job_copy,
    log_tail,
    open_session,
    record_profile,
    remember,
    remembered,
    slurm_job_id,
    slurm_output_path,
    slurm_step,
    slurm_view,
    state_dirs,
    submission_of,
    submit_failed,
)
from ckpteval.execution.snapshot import settle_tasks, take_snapshot
from ckpteval.execution.staging import stage_data, stage_images
from ckpteval.execution.state import State, end_state
from ckpteval.invocation.jobdir import JobDir
from ckpteval.invocation.record import InvocationRecord, write_text_atomic
from ckpteval.job.build import HOOK_SUBDIR, Toolchain
from ckpteval.job.script import render_job_script
from ckpteval.results.model import InvocationResults

if TYPE_CHECKING:
    from ckpteval.checkpoint.description import CheckpointDescription
    from ckpteval.execution.planned import PlannedJob
    from ckpteval.execution.slurm_kept import KeptSlurmJob
    from ckpteval.job.plan import JobPlan

POLL_SLURM_S = 3.0
UNKNOWN_GRACE_S = 120.0  # sacct can lag a new or just-ended job; longer than this, the job is gone
FOLLOW_INTERVAL_S = 2.0  # a redraw costs a remote command or two: cheap, but not free on a busy login node


class SlurmHost:
    """A Slurm cluster, as where a new job goes: one connection (reopened if it drops), checked as it opens
    (the partition and account against the cluster, before the slow nemo-run import; the job's Python)."""

    def __init__(self, job: PlannedJob, report: Reporter | None) -> None:
        from ckpteval.cluster.preflight import check_builtin_python
        from ckpteval.cluster.slurm import check_request, cluster_facts

        self.compiled = job.compiled
        self.profile: Profile = job.profile
        self.spec = sbatch_spec(job.compiled, job.invocation, job.job_dir)
        warn = (lambda m: report(Note(m, "warning"))) if report is not None else None
        self.session = ClusterSession(self.profile, on_reconnect=warn)
        self.facts: ClusterFacts | None = None
        if report is None:
            return  # a read-only look (the checkpoint, for a dry run with --check): nothing is submitted
        try:
            remote = self.session.remote  # connects: unknown host key, failed login, unreachable host end here
            report(Note(f"connected to {remote.description}"))
            self.facts = cluster_facts(remote)
            where = remote.description
            check_request(self.facts, partition=self.spec.partition, account=self.spec.account, where=where)
            check_builtin_python(remote, job.plan, self.profile)  # the job's python imports ckpteval there
        except BaseException:
            self.session.close()
            raise

    @property
    def remote(self) -> Remote:
        return self.session.remote

    @property
    def description(self) -> str:
        return self.session.remote.description

    def __enter__(self) -> SlurmHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def checkpoint_to_read(self, compiled: CompiledConfig) -> str | None:
        """The checkpoint's path on the cluster; None for a packaged model the job prepares (ckpteval's own)."""
        deployment = compiled.config.deployment
        path = getattr(deployment, "checkpoint_path", None)
        if not path or getattr(deployment, "prepare", None):
            return None
        return str(path)

    def describe_checkpoint(self, path: str, *, tokenizer: str | None, origin: str | None) -> CheckpointDescription:
        """Its small files over SSH, in one round trip."""
        from ckpteval.cluster.checkpoint_files import describe_remote_checkpoint

        return self.session.call(
            lambda remote: describe_remote_checkpoint(remote, path, tokenizer=tokenizer, origin=origin)
        )

    def write_job_files(self, job_dir: str, files: dict[str, str]) -> None:
        """Upload them, with the harness's offline-data hook, to the job directory on the cluster."""
        upload_job_files(self.remote, job_dir, files, local_hook_dir())

    def record_fields(self) -> dict[str, Any]:
        """How to reach the cluster again (secrets redacted) and the Slurm request."""
        submission = SlurmSubmission(
            connection=self.compiled.secrets.redact_data(self.profile.to_config()),
            sbatch=dataclasses.asdict(self.spec),
        )
        return {"placement": submission}

    def place_results(self, record: InvocationRecord) -> None:
        record.local_results_dir = str(local_job_copy(record))  # fetched there when the job has ended

    def start(self, record: InvocationRecord, files: dict[str, str], report: Reporter) -> SlurmJob:
        """Keep the job script beside the record, then submit through nemo-run; with `deployment.load_into`
        (`evaluate watch`'s kept job, `execution.slurm_kept`), start it as a step of that job instead."""
        write_text_atomic(record.path / JobDir.SCRIPT, files[JobDir.SCRIPT])
        load_into = getattr(self.compiled.config.deployment, "load_into", None)
        if load_into:
            start_in_kept_job(record, self.spec, self.session, str(load_into), report)
        else:
            submit_job(record, self.spec, self.profile, report, facts=self.facts)
        return SlurmJob(record, self.session)

    def close(self) -> None:
        self.session.close()


def submit_job(
    record: InvocationRecord,
    spec: SbatchSpec,
    profile: Profile,
    report: Reporter,
    *,
    facts: ClusterFacts | None = None,
) -> None:
    """Submit the job through nemo-run and note its Slurm job id in the record (saved)."""
    from ckpteval.cluster.nemorun import submit

    slurm = submission_of(record)
    report(Note(f"submitting with nemo-run (job {spec.job_name}) ..."))
    try:
        submitted = submit(spec, profile, log_path=record.path / "nemo-run.log", facts=facts)
    except ClusterError as exc:
        slurm.submit_error = exc.message
        record.save()
        raise
    slurm.job_ids.append(submitted.job_id)
    record.job_label = f"Slurm job {submitted.job_id}"
    slurm.nemo_run_experiment = submitted.experiment_id
    slurm.nemo_run_dir = submitted.nemo_run_dir
    slurm.submit_error = None
    record.final = None  # a new job: its status is asked again
    record.save()
    if submitted.sbatch_script:
        write_text_atomic(record.path / "sbatch.sh", submitted.sbatch_script)


def start_in_kept_job(
    record: InvocationRecord, spec: SbatchSpec, session: ClusterSession, load_into: str, report: Reporter
) -> None:
    """Run the invocation's job script as a step of the Slurm job that holds the kept server whose load
    directory is `load_into` (its id in `<load_into>/slurm_job`): on the server's node, sharing its allocation,
    so the job's deployment step reaches the server on 127.0.0.1 (`server.inplace_client.stand_in`). Noted in
    the record as that job with the step's name (saved). DeploymentError when that job no longer runs."""
    from ckpteval.cluster.slurm import start_step
    from ckpteval.errors import DeploymentError
    from ckpteval.execution.slurm_kept import JOB_FILE

    slurm = submission_of(record)
    text = session.call(lambda r: r.read_text_if_exists(posixpath.join(load_into, JOB_FILE)))
    job_id = (text or "").strip()
    state = session.call(lambda r: job_state(r, job_id)) if job_id else None
    if state is None or state.state != "RUNNING":
        slurm.submit_error = f"no kept Slurm job runs for {load_into}" + (
            f" (job {job_id}: {state.state.lower()})" if state else ""
        )
        record.save()
        raise DeploymentError(
            f"The kept deployment of {load_into} does not run: {slurm.submit_error}.",
            hint="Start a fresh deployment instead (drop deployment.load_into).",
        )
    name = spec.job_name
    report(Note(f"starting the job script as step {name} of kept Slurm job {job_id} ..."))
    command = f"exec {spec.command()}"
    output = kept_step_output(record.job_dir)
    session.call(lambda r: start_step(r, job_id, name=name, command=command, output=output))
    slurm.job_ids.append(job_id)
    slurm.step = name
    slurm.submit_error = None
    record.job_label = f"step of Slurm job {job_id}"
    record.final = None
    record.save()


def slurm_toolchain(python: str, job_dir: str) -> Toolchain:
    """A cluster: the profile's Python (builtin deployment), `nemo-evaluator` as the eval-factory image has
    it, and the offline-data hook uploaded into the job directory (`<job_dir>/hook`, mounted with it)."""
    return Toolchain(python=python, evaluator="nemo-evaluator", hook_dir=f"{job_dir}/{HOOK_SUBDIR}")


class SlurmJob:
    """A submitted Slurm job of one invocation: followed over the connection that submitted it, or
    re-attached from its record (`SlurmBackend.attach`), connecting to its cluster on first use."""

    exports_here = False  # the job exports its own results as it ends (`with_export_step`)
    runs_detached = True

    def __init__(self, record: InvocationRecord, session: ClusterSession | None = None) -> None:
        self.record = record
        self._session = session
        self.final: SlurmJobState | None = None

    @property
    def session(self) -> ClusterSession:
        """The connection to the job's cluster (opened from the record on first use)."""
        if self._session is None:
            self._session = open_session(self.record)
        return self._session

    def __enter__(self) -> SlurmJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def slurm_state(self) -> SlurmJobState:
        """Slurm's view of the latest job of the invocation (squeue, then sacct); of its step in watch's kept
        job where it ran as one (`job_id` then `JOB.STEP` once Slurm knows it)."""
        from ckpteval.cluster.slurm import step_state

        job_id, step = str(slurm_job_id(self.record)), slurm_step(self.record)
        if step:
            return self.session.call(lambda r: step_state(r, job_id, step))
        return self.session.call(lambda r: job_state(r, job_id))

    def follow(self, report: Reporter) -> None:
        """Report progress and the job's log until Slurm says the job has ended."""
        from ckpteval.tasks.progress import progress_reader

        record = self.record
        report(Note(f"following invocation {record.id} (Ctrl-C to detach or cancel)", "notice"))
        watcher = _SlurmWatch(self.session, str(slurm_job_id(record)), report, ask=self.slurm_state)
        log = LogTail(self.session, JobDir(record.job_dir).join(JobDir.JOB_LOG))
        view = RemoteJobView(self.session, record.job_dir)
        dirs = state_dirs(record)
        watch(
            view,
            record.task_dirs,
            is_running=watcher.running,
            report=report,
            progress=progress_reader,
            interval=FOLLOW_INTERVAL_S,
            new_log_lines=log.read,
            before_snapshot=lambda: view.prefetch(dirs),  # the snapshot then reads from one round trip
        )
        from ckpteval.execution.events import LogLines

        rest = log.read(final=True)
        if rest:
            report(LogLines(tuple(rest)))
        self.final = watcher.refresh(force=True)

    def interrupt(self) -> bool:
        """Ctrl-C leaves the job running on the cluster."""
        return False

    def collect(self) -> InvocationResults:
        return fetch_results(self.session, self.record, final=True)

    def end(self, results: InvocationResults) -> JobEnd:
        word = self.final.state if self.final else "UNKNOWN"
        if results.status == "succeeded" and word == "COMPLETED":
            return JobEnd("succeeded")
        state = end_state(None, word) or "failed"
        tail = log_tail(self.session, self.record)
        return JobEnd(
            "failed" if state == "succeeded" else state, f"the job ended {word.lower()}; last lines of its log:", tail
        )

    def status(self) -> InvocationStatus:
        """The invocation's state from Slurm (squeue/sacct) and the job's state files, in one connection.

        Once the latest job has ended its status is kept in the record, so listing old invocations does
        not connect to their clusters again.
        """
        record = self.record
        known = submit_failed(record) or remembered(record)
        if known:
            return known
        slurm = self.slurm_state()
        view = RemoteJobView(self.session, record.job_dir)
        view.prefetch(state_dirs(record))
        from ckpteval.tasks.progress import progress_reader

        snapshot = take_snapshot(view, record.task_dirs, progress_reader)
        state, detail = combine_state(slurm, snapshot)
        if slurm_step(record) and "." in slurm.job_id:
            submission_of(record).step_id = slurm.job_id  # saved with the final status
        tail = log_tail(self.session, record) if state == "failed" else ""
        status = InvocationStatus(
            record=record,
            state=state,
            snapshot=settle_tasks(snapshot, slurm.active, state),
            detail=detail,
            executor_view=slurm_view(slurm.job_id, slurm_step(record)),
            log_tail=tail,
        )
        if state in ("succeeded", "failed", "cancelled"):
            remember(status)
        return status

    def state(self) -> State:
        return self.status().state

    def read(self, path: str) -> str | None:
        """A file of the job directory on the cluster (one round trip)."""
        if not slurm_job_id(self.record):
            return None
        full = JobDir(self.record.job_dir).join(path)
        return self.session.call(lambda r: r.read_text_if_exists(full))

    def cancel(self) -> str:
        """scancel the job and wait until Slurm has stopped it (the deployment with it)."""
        record = self.record
        if not slurm_job_id(record):
            return f"invocation {record.id} was never submitted"
        before = self.slurm_state()
        if not before.active:
            return f"invocation {record.id} is not running (Slurm job {before.job_id}: {before.state.lower()})"
        if slurm_step(record):  # a step of watch's kept job: that step only (the kept server goes on)
            return self._cancel_step(before)
        after = self.session.call(lambda r: cancel_job(r, str(slurm_job_id(record))))
        if after.active:
            return (
                f"asked Slurm to cancel job {after.job_id} of invocation {record.id}; it is still {after.state.lower()}"
            )
        return f"cancelled invocation {record.id} (Slurm job {after.job_id}: {after.state.lower()})"

    def _cancel_step(self, before: SlurmJobState, wait: float = 60.0) -> str:
        record = self.record
        if "." in before.job_id:
            self.session.call(lambda r: r.run(["scancel", before.job_id], timeout=60, check=False))
        deadline = time.monotonic() + wait
        after = self.slurm_state()
        while after.active and time.monotonic() < deadline:
            if "." in after.job_id and "." not in before.job_id:  # the step started meanwhile
                return self._cancel_step(after, max(0.0, deadline - time.monotonic()))
            time.sleep(0.5)
            after = self.slurm_state()
        if after.active:
            return (
                f"asked Slurm to cancel step {after.job_id} of invocation {record.id}; "
                f"it is still {after.state.lower()}"
            )
        return f"cancelled invocation {record.id} (Slurm step {after.job_id}: {after.state.lower()})"

    def logs(self, *, follow: bool = False, source: str = "job") -> Iterator[str]:
        """The job's log lines (`job`, `deployment`, a task name, or `slurm` for nemo-run's sbatch output);
        with `follow`, keep yielding new lines until the job has ended (reconnecting if the connection drops)."""
        record = self.record
        if not slurm_job_id(record):
            raise EvaluationError(
                f"Invocation {record.id} was never submitted: it has no log.",
                hint=submission_of(record).submit_error or "",
            )
        path = slurm_output_path(record) if source == "slurm" else JobDir(record.job_dir).join(task_log(record, source))
        tail = LogTail(self.session, path)
        last_check = 0.0
        while True:
            yield from tail.read()
            if not follow:
                yield from tail.read(final=True)
                return
            if time.monotonic() - last_check > 3.0:
                last_check = time.monotonic()
                if not self.slurm_state().active:
                    yield from tail.read(final=True)
                    return
            time.sleep(1.0)

    def results(self) -> InvocationResults:
        """results.json fetched before, or fetched from the cluster now (partial while the job still runs)."""
        from ckpteval.results.store import read_results

        record = self.record
        local = local_job_copy(record) / JobDir.RESULTS
        if local.is_file() and submission_of(record).results_of_job == slurm_job_id(record):
            return read_results(local)
        if not slurm_job_id(record):
            raise EvaluationError(f"Invocation {record.id} was never submitted: it has no results.")
        return fetch_results(self.session, record, final=not self.slurm_state().active)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()


class _SlurmWatch:
    """Slurm's state of the job, asked at most every few seconds; reports when it changes."""

    def __init__(
        self, session: ClusterSession, job_id: str, report: Reporter, ask: Callable[[], SlurmJobState] | None = None
    ) -> None:
        self.session = session
        self.job_id = job_id
        self.report = report
        self.ask = ask or (lambda: self.session.call(lambda r: job_state(r, self.job_id)))
        self.state: SlurmJobState | None = None
        self._asked = 0.0
        self._unknown_since: float | None = None

    def refresh(self, *, force: bool = False) -> SlurmJobState:
        if force or self.state is None or time.monotonic() - self._asked >= POLL_SLURM_S:
            self._asked = time.monotonic()
            new = self.ask()
            if self.state is None or (new.state, new.reason) != (self.state.state, self.state.reason):
                why = f" ({new.reason})" if new.reason else ""
                self.report(Note(f"Slurm job {self.job_id}: {new.state.lower()}{why}", "change"))
            self.state = new
        return self.state

    def running(self) -> bool:
        state = self.refresh()
        if state.state != "UNKNOWN":
            self._unknown_since = None
            return state.active
        # right after submission, or while sacct lags: keep watching, for a while
        now = time.monotonic()
        self._unknown_since = self._unknown_since or now
        return now - self._unknown_since < UNKNOWN_GRACE_S


class SlurmScripts:
    """A Slurm cluster as where scripts of ours that are no invocation run (the cluster-hosted watcher's
    links): sbatch, squeue and scancel over one connection, through `ckpteval.cluster.slurm`."""

    def __init__(self, profile: Profile) -> None:
        from ckpteval.cluster.connect import connect_remote

        self.remote = connect_remote(profile)

    @property
    def description(self) -> str:
        return self.remote.description

    def __enter__(self) -> SlurmScripts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, directory: str, files: dict[str, str], script: str, *, what: str) -> ScriptJob:
        from ckpteval.cluster.slurm import submit_script

        for name, text in files.items():
            self.remote.write_text_atomic(posixpath.join(directory, name), text)
        return ScriptJob(submit_script(self.remote, posixpath.join(directory, script), what=what), "PENDING")

    def jobs(self, name: str) -> list[ScriptJob]:
        from ckpteval.cluster.slurm import jobs_named

        return [ScriptJob(j.job_id, j.state, j.node, j.reason) for j in jobs_named(self.remote, name)]

    def cancel(self, jobs: list[ScriptJob], *, signal: str | None = None) -> None:
        from ckpteval.cluster.slurm import cancel_jobs

        cancel_jobs(self.remote, [j.job_id for j in jobs], signal=signal)

    def cancel_named(self, name: str) -> None:
        from ckpteval.cluster.slurm import cancel_named

        cancel_named(self.remote, name)

    def close(self) -> None:
        self.remote.close()


class SlurmBackend:
    """Jobs on a Slurm cluster."""

    executor = "slurm"

    @property
    def launcher(self) -> Launcher:
        """How this executor's job scripts start their steps, as the registry says."""
        return find_executor(self.executor).launcher

    exports_here = False  # the job exports its own results as it ends (the pipeline adds the export step)
    reads_remotely = True
    # datasets of an offline cluster (refused first when missing), then squashed images
    staging = (stage_data, stage_images)

    def accept(self, compiled: CompiledConfig) -> None:
        remote_job_dir(compiled, "")  # a config whose execution section is not Slurm's ends here

    def job_dir(self, compiled: CompiledConfig, invocation: str) -> str:
        return remote_job_dir(compiled, invocation)

    def toolchain(self, compiled: CompiledConfig, job_dir: str) -> Toolchain:
        return slurm_toolchain(compiled.profile.part.step_python(), job_dir)

    def refuse_secrets(self, compiled: CompiledConfig, plan: JobPlan) -> None:
        check_no_secrets(compiled, plan)

    def connect(self, job: PlannedJob, report: Reporter | None = None) -> SlurmHost:
        return SlurmHost(job, report)

    def host_scripts(self, profile: Profile) -> SlurmScripts:
        """The cluster of `profile`, for the cluster-hosted watcher's links."""
        return SlurmScripts(profile)

    def preview(self, job: PlannedJob, *, check: bool = False) -> list[PreviewPanel]:
        """The sbatch script nemo-run will submit, the job script, and the squash plan (the cluster is not
        asked unless `check`)."""
        from ckpteval.cluster.export_deploy import preview_entry_point
        from ckpteval.cluster.squash import plan_squash
        from ckpteval.execution.staging import data_statuses, with_data
        from ckpteval.job.request_groups import request_groups_panel

        spec = sbatch_spec(job.compiled, job.invocation, job.job_dir)
        squash = plan_squash(job.images, job.profile, check=check, force=job.force_squash)
        # Export-Deploy's entry point: from a probe/cache with `check`, else the default layout
        plan, entry_panel = preview_entry_point(job.plan, job.compiled, squash, check=check)
        data_panels: list[PreviewPanel] = []
        if job.profile.part.data_offline():
            from ckpteval.tasks.data_status import render_statuses

            if check:  # --dry-run --check: the cluster is asked, read-only, which datasets it has
                from ckpteval.cluster.connect import connect_remote

                with connect_remote(job.profile) as remote:
                    statuses = data_statuses(job.compiled, remote) or []
            else:
                statuses = data_statuses(job.compiled, None) or []
            plan = with_data(job.compiled, plan, statuses)
            body = render_statuses(statuses)
            if not check:
                body += (
                    "\n\n(the cluster was not asked: `unchecked` tasks were fetched here and are pushed at "
                    "submission unless staged already; --check asks it)"
                )
            data_panels.append(PreviewPanel(title="task data (compute_internet = false)", body=body))
        # the script as it will run: images shown as their .sqsh files
        script = render_job_script(with_images(plan, squash.mapping), launcher=self.launcher)
        requests = request_groups_panel(plan)  # Export-Deploy's entry point may say it mixes request settings
        return [
            PreviewPanel(
                title="sbatch script (submitted by nemo-run)", body=render_sbatch_preview(spec), language="bash"
            ),
            PreviewPanel(title=f"job script ({spec.job_script})", body=script, language="bash"),
            PreviewPanel(title="squash plan", body="", squash=squash),
            *data_panels,
            *([entry_panel] if entry_panel else []),
            *([requests] if requests else []),
        ]

    def describe_checkpoint(
        self, profile: Profile, path: str, *, tokenizer: str | None, origin: str | None
    ) -> CheckpointDescription:
        """Its small files over the profile's SSH, in one round trip."""
        from ckpteval.cluster.checkpoint_files import describe_at

        return describe_at(profile, path, tokenizer=tokenizer, origin=origin)

    def attach(self, record: InvocationRecord) -> SlurmJob:
        return SlurmJob(record)

    def kept_job_refusal(self) -> str:
        """Why this watcher cannot keep a Slurm job across checkpoints ("" when it can)."""
        from ckpteval.execution.slurm_kept import why_no_kept_job

        return why_no_kept_job()

    def kept_job(
        self,
        run: str,
        profile: Profile,
        compile_first: Callable[[int, str], Any] | None,
        *,
        on_note: Callable[[str, int | None], None] = lambda _m, _i: None,
    ) -> KeptSlurmJob:
        """`evaluate watch`'s one job kept across a run's checkpoints (`execution.slurm_kept`): each checkpoint's
        job script runs as a step of it (`start_in_kept_job`)."""
        from ckpteval.execution.slurm_kept import KeptSlurmJob

        return KeptSlurmJob(run, profile, compile_first, on_note=on_note)

    def resume(self, record: InvocationRecord, report: Reporter) -> SlurmJob:
        """Resubmit the same job script with the Slurm request recorded at submission."""
        submission = submission_of(record)
        if submission.step:
            raise ConfigError(
                f"Invocation {record.id} ran as a step of `evaluate watch`'s kept Slurm job: it has no job of its "
                "own to resubmit.",
                hint="Start the watcher again with the same command: it evaluates the checkpoint again.",
            )
        if not submission.sbatch:
            raise ConfigError(f"Invocation {record.id} has no recorded Slurm request to resubmit.")
        spec = SbatchSpec(**submission.sbatch)
        profile = record_profile(record)
        session = ClusterSession(profile, on_reconnect=lambda m: report(Note(m, "warning")))
        try:
            remote = session.remote
            latest = slurm_job_id(record)
            if latest:
                state = job_state(remote, latest)
                if state.active:
                    raise ConfigError(
                        f"Invocation {record.id} is still {state.state.lower()} (Slurm job {state.job_id}).",
                        hint=f"Wait for it, or `evaluate cancel {record.id}` first.",
                    )
            if not remote.exists(spec.job_script):
                raise ClusterError(
                    f"The job script of invocation {record.id} is gone from the cluster: {spec.job_script}.",
                    hint="Run the `evaluate` command again to start over.",
                )
            submit_job(record, spec, profile, report)
        except BaseException:
            session.close()
            raise
        return SlurmJob(record, session)
