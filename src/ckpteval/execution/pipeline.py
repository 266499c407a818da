"""One invocation from a compiled config to a started job: the same steps wherever the job runs.

`plan_job` picks the job backend of the profile's executor (`ckpteval.execution.backends`) and plans the job
(nothing written, nothing contacted); `PreparedJob.submit` then runs, over one connection to where the job
runs (the backend's `JobHost`):

1. check where the job goes (a cluster: partition, account, its Python) — the host, as it opens;
2. describe the checkpoint and refuse one its deployment backend cannot serve (`check_checkpoint`);
3. stage what the job reads, each step contributed by whoever needs it, none named here: the executor's
   (`JobBackend.staging`: e.g. datasets of an offline machine, squashed container images,
   `ckpteval.execution.staging`), the credentials of each export destination of a job that exports itself
   (`stage_secrets`, which adds the export step), and the deployment backend's (`before_start`: e.g.
   Export-Deploy's entry point probed in its image);
4. render the job's files (secrets refused where they would leave this machine) and write them where the
   job runs;
5. record the invocation here (status, logs, cancel and results work from any shell);
6. hand the job to the host to start: a `Job` handle to follow.

A backend is a transport: where the job directory is, how the job script starts its steps, a host to write
files into and start the job, and the record-keyed status, logs, cancel, results and resume.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckpteval.config.compile import CompiledConfig
from ckpteval.config.preview import PreviewPanel
from ckpteval.execution.backends import backend_for
from ckpteval.execution.events import Note, Reporter
from ckpteval.execution.planned import PlannedJob, add_export_step
from ckpteval.invocation.jobdir import JobDir
from ckpteval.invocation.record import new_record, write_text_atomic
from ckpteval.job.files import job_files
from ckpteval.job.plan import JobPlan, task_entries

if TYPE_CHECKING:
    from ckpteval.checkpoint.description import CheckpointDescription
    from ckpteval.execution.backend import Job, JobBackend, JobHost, Remote
    from ckpteval.tasks.runnable import Unmet


def plan_job(compiled: CompiledConfig, invocation: str, *, force_squash: bool = False) -> PreparedJob:
    """The job of a new invocation, planned for where its profile runs it (refused there if it cannot run)."""
    backend = backend_for(compiled.profile.executor)
    backend.accept(compiled)
    refuse_unrunnable(compiled)  # a task that cannot run where the job runs ends here, dry run or not
    job_dir = backend.job_dir(compiled, invocation)
    job = PlannedJob.make(
        compiled,
        invocation,
        job_dir=job_dir,
        toolchain=backend.toolchain(compiled, job_dir),
        launcher=backend.launcher,
        exports_itself=not backend.exports_here,
        force_squash=force_squash,
    )
    return PreparedJob(job, backend)


@dataclass
class PreparedJob:
    """A planned job and the backend it goes to: nothing written, nothing contacted (unless asked to check)."""

    job: PlannedJob
    backend: JobBackend

    @property
    def plan(self) -> JobPlan:
        return self.job.plan

    @property
    def description(self) -> CheckpointDescription | None:
        """The checkpoint, once `check_checkpoint` (or `submit`) has read it."""
        return self.job.description

    def check_checkpoint(self, *, check: bool = False) -> list[PreviewPanel]:
        """Describe the checkpoint the job serves and refuse (DeploymentError) when its backend cannot serve it;
        the description as a preview panel. Read-only; where reading it means contacting a cluster, only
        with `check` (a real run reads it in `submit`, before anything is written)."""
        if self.backend.reads_remotely and not check:
            return []
        with self.backend.connect(self.job) as host:
            panel = check_checkpoint(self.job, host)
        return [panel] if panel else []

    def preview(self, *, check: bool = False) -> list[PreviewPanel]:
        """The panels after the compiled config: the job script, and what the backend adds (e.g. the sbatch
        script, the squash plan, the task data of an offline cluster)."""
        return self.backend.preview(self.job, check=check)

    def submit(self, report: Reporter) -> Job:
        """Check, stage, render, write, record, start (the connection stays open for following)."""
        job, backend = self.job, self.backend
        backend.refuse_secrets(job.compiled, job.plan)  # before anything is contacted
        host = backend.connect(job, report)
        try:
            # a checkpoint its backend cannot serve ends here (read once: a preview may have read it already)
            checkpoint = check_checkpoint(job, host) if job.description is None else None
            if checkpoint is not None and backend.reads_remotely:
                report(Note(checkpoint.title))
            plan = job.plan
            for step in backend.staging:  # the executor's: what its machine needs before the job starts
                plan = step(job, plan, host, report)
            plan = stage_secrets(job, plan, host, report)
            plan = before_start(job, plan, host, report)
            files = job_files(job.compiled, plan, launcher=backend.launcher, checkpoint=job.description)
            host.write_job_files(job.job_dir, files)
            record = new_record(
                job.compiled,
                job.invocation,
                executor=backend.executor,
                job_dir=job.job_dir,
                tasks=task_entries(plan),
                **host.record_fields(),
            )
            host.place_results(record)
            record.save()
            for name in JobDir.RECORDED:
                write_text_atomic(record.path / name, files[name])
            return host.start(record, files, report)
        except BaseException:
            host.close()
            raise


def check_checkpoint(job: PlannedJob, host: JobHost) -> PreviewPanel | None:
    """Describe the job's checkpoint where the job runs (`host`); DeploymentError when its deployment backend
    cannot serve it; None when there is nothing to read yet (a packaged model the job prepares)."""
    from ckpteval.checkpoint.description import (
        backend_of,
        checkpoint_panel,
        clients_read,
        refuse_origin_mismatch,
        refuse_unexpected_tensors,
        refuse_unservable,
        user_tokenizer,
    )

    deployment = job.compiled.config.deployment
    backend = backend_of(deployment, on_cluster=job.compiled.config.execution.on_cluster)
    path = host.checkpoint_to_read(job.compiled)
    if backend is None or path is None:
        return None
    description = host.describe_checkpoint(
        path, tokenizer=user_tokenizer(deployment), origin=getattr(deployment, "origin", None)
    )
    refuse_unservable(description, backend, clients_read=clients_read(deployment, path))
    refuse_origin_mismatch(description, ignore=getattr(deployment, "ignore_origin_mismatch", False))
    refuse_unexpected_tensors(description, ignore=getattr(deployment, "ignore_unexpected_tensors", False))
    job.described(description)  # the job now serves the iteration described (pinned)
    panel = checkpoint_panel(description, backend)
    if job.plan.deployment.export_step is None:
        return panel
    from ckpteval.job.hf_export import export_status

    status = export_status(job.compiled, description, host.remote)
    return dataclasses.replace(panel, body=f"{panel.body}\nexport        {status}")


def refuse_unrunnable(compiled: CompiledConfig) -> None:
    """Refuse (ConfigError), before anything is written, the tasks that cannot run where the job runs: one
    line per task with its fix (`ckpteval.tasks.runnable`: harness installed, endpoint type served, and on
    this machine data available)."""
    from ckpteval.config.compile import served_endpoint_types
    from ckpteval.tasks.runnable import endpoint_served, harness_installed, refuse_unmet

    config = compiled.config
    served = served_endpoint_types(config)
    unmet = []
    for task in compiled.tasks:
        found = harness_installed(task.spec, in_container=config.execution.runs_containers) or endpoint_served(
            task.spec, task.endpoint_type, served
        )
        if found is not None:
            unmet.append(found)
    if not config.execution.on_cluster:
        refused = {u.task for u in unmet}
        left = dataclasses.replace(compiled, tasks=tuple(t for t in compiled.tasks if t.spec.name not in refused))
        unmet += hubless(left)
    refuse_unmet(unmet)


def refuse_hubless(compiled: CompiledConfig) -> None:
    """On this machine: refuse (ConfigError) the tasks whose data cannot be read here (`hubless`)."""
    from ckpteval.tasks.runnable import refuse_unmet

    refuse_unmet(hubless(compiled))


def hubless(compiled: CompiledConfig) -> list[Unmet]:
    """On this machine: the tasks that can only read their datasets from the Hugging Face Hub (neither
    fetched into the dataset cache nor packaged, nor a `dataset_dir`) when the hub does not answer with the
    job's environment. The hub is asked only when such a task is in the run (a few seconds at most); a task
    whose data ckpteval does not know is not checked."""
    from ckpteval.tasks.data_cache import default_cache_dir, is_cached
    from ckpteval.tasks.data_status import hub_needs
    from ckpteval.tasks.offline_data import hub_reachable
    from ckpteval.tasks.runnable import data_available

    local = default_cache_dir()
    config = compiled.config
    common = {**getattr(config.execution, "env_vars", {}), **config.evaluation.env_vars}
    tasks = [task for task in compiled.tasks if not task.dataset_dir]
    needs = hub_needs(
        [task.spec for task in tasks],
        cached_here=lambda ref: is_cached(local, ref),
        packaged_counts=config.evaluation.offline_data != "off",  # "off": packaged data is never read
    )
    env_of = {task.spec.name: {**common, **task.env_vars} for task in tasks}  # statuses name the spec
    spec_of = {task.spec.name: task.spec for task in tasks}
    answers: dict[tuple[tuple[str, str], ...], bool] = {}
    unmet = []
    for status in needs:
        env = env_of[status.task]
        key = tuple(sorted((k, v) for k, v in env.items() if k.startswith("HF_")))
        if key not in answers:
            answers[key] = hub_reachable(env=env)
        if not answers[key]:
            found = data_available(spec_of[status.task], [ref.key for ref in status.missing], cache=str(local))
            if found is not None:
                unmet.append(found)
    return unmet


def stage_secrets(job: PlannedJob, plan: JobPlan, host: JobHost, report: Reporter) -> JobPlan:
    """Give a job that exports itself the credentials its export destinations need (each destination's
    `stage_secret`: W&B's key), and the API judge its key, in owner-only files where it runs (never in the
    script or the preview); `plan` with the export step reading them."""
    stage_judge_key(job, host.remote)
    if not plan.after_tasks:
        return plan
    from ckpteval.export.destinations import stage_export_secrets

    warn: Callable[[str], None] = lambda m: report(Note(m, "warning"))  # noqa: E731
    key_file = stage_export_secrets(host.remote, job.compiled, job.job_dir, on_note=warn)
    return add_export_step(plan, job.compiled, key_file=key_file)


def before_start(job: PlannedJob, plan: JobPlan, host: JobHost, report: Reporter) -> JobPlan:
    """The deployment backend's own step where the job runs, if it has one (`DeploymentBackend.before_start`:
    Export-Deploy probes the entry point its image really has); `plan` built for what it found."""
    from ckpteval.deploy.backends import deployment_kind, registered_backends

    deployment = registered_backends().get(deployment_kind(job.compiled.config.deployment))
    if deployment is None or deployment.before_start is None:
        return plan
    module, _, name = deployment.before_start.partition(":")
    plan, note = getattr(importlib.import_module(module), name)(plan, job.compiled, host.remote)
    if note:
        report(Note(note))
    return plan


def stage_judge_key(job: PlannedJob, remote: Remote) -> None:
    """Give the job the API judge's key (from the variable `judge.api_key_name` names here) in an owner-only
    file where it runs, as the W&B key is given; the key joins the secrets every later rendering redacts."""
    import os

    judge = job.compiled.config.judge
    name = getattr(judge, "api_key_name", None)
    if judge.type != "api" or not name:
        return
    from ckpteval.export.credentials import write_secret_file
    from ckpteval.job.build import judge_key_file

    key = os.environ.get(name, "")
    job.compiled.secrets.add(key)
    write_secret_file(remote, judge_key_file(job.job_dir), key)
