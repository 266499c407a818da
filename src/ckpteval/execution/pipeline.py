"""One invocation from a compiled config to a started job: the same steps wherever the job runs.

`plan_job` picks the job backend of the profile's executor (`ckpteval.execution.backends`) and plans the job
(nothing written, nothing contacted); `PreparedJob.submit` then runs, over one connection to where the job
runs (the backend's `JobHost`):

1. check where the job goes (a cluster: partition, account, its Python) — the host, as it opens;
2. describe the checkpoint and refuse one its deployment backend cannot serve (`check_checkpoint`);
3. stage what the job reads: datasets of an offline cluster (`stage_data`), the W&B key of a job that exports
   itself (`stage_secrets`, which adds the export step), squashed container images (`stage_images`), and
   Export-Deploy's entry point probed in its image;
4. render the job's files (secrets refused on a cluster) and write them where the job runs;
5. record the invocation here (status, logs, cancel and results work from any shell);
6. hand the job to the host to start: a `Job` handle to follow.

A backend is a transport: where the job directory is, how the job script starts its steps, a host to write
files into and start the job, and the record-keyed status, logs, cancel, results and resume.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
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
    from ckpteval.cluster.remote import Remote
    from ckpteval.execution.backend import Job, JobBackend, JobHost
    from ckpteval.tasks.data_status import TaskDataStatus
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
        from ckpteval.cluster.export_deploy import resolve_for_run

        job, backend = self.job, self.backend
        backend.refuse_secrets(job.compiled, job.plan)  # before anything is contacted
        host = backend.connect(job, report)
        try:
            # a checkpoint its backend cannot serve ends here (read once: a preview may have read it already)
            checkpoint = check_checkpoint(job, host) if job.description is None else None
            if checkpoint is not None and backend.reads_remotely:
                report(Note(checkpoint.title))
            statuses = data_statuses(job.compiled, host.remote, report=host.description)
            plan = stage_secrets(job, host.remote, report)
            stage_export_cache(job, host.remote)
            plan = stage_images(job, plan, host.remote, report)
            if statuses is not None:
                plan = stage_data(job.compiled, plan, host.remote, statuses, report)
            plan, entry_note = resolve_for_run(plan, job.compiled, host.remote)  # Export-Deploy's script
            if entry_note:
                report(Note(entry_note))
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


def data_statuses(
    compiled: CompiledConfig, remote: Remote | None, *, report: str | None = None
) -> list[TaskDataStatus] | None:
    """Per task, whether its datasets are staged where the job runs (asked on `remote`, one round trip),
    fetched here (pushed at submission), or missing; None when the job's compute nodes reach the hub.

    Without `remote` the cluster is not asked. With `report` (where the job runs, in words) a task whose
    data the offline job cannot read is refused (ConfigError)."""
    if compiled.profile.compute_internet or not compiled.config.execution.on_cluster:
        return None
    from ckpteval.cluster.data_push import datasets_dir, staged_status
    from ckpteval.tasks.data_cache import default_cache_dir, is_cached
    from ckpteval.tasks.data_status import data_statuses as statuses_of
    from ckpteval.tasks.data_status import refuse_missing
    from ckpteval.tasks.datasets import task_data

    local = default_cache_dir()
    specs = [task.spec for task in compiled.tasks]
    there = None
    if remote is not None:
        refs = [ref for spec in specs for ref in (task_data(spec).datasets or ())]
        answer = staged_status(remote, datasets_dir(compiled.profile), list(dict.fromkeys(refs)), local)
        there = answer.__getitem__
    found = statuses_of(specs, cached_here=lambda ref: is_cached(local, ref), staged_there=there)
    if report is not None:
        refuse_missing(found, profile=compiled.profile.name, where=report)
    return found


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


def with_data(compiled: CompiledConfig, plan: JobPlan, statuses: list[TaskDataStatus]) -> JobPlan:
    """`plan` with every task step reading the staged datasets (the staged ones' real data)."""
    from ckpteval.cluster.data_push import datasets_dir
    from ckpteval.cluster.submission import with_staged_data

    staged = {s.task for s in statuses if s.staged}
    return with_staged_data(plan, datasets_dir(compiled.profile), staged)


def stage_data(
    compiled: CompiledConfig, plan: JobPlan, remote: Remote, statuses: list[TaskDataStatus], report: Reporter
) -> JobPlan:
    """Push the datasets fetched here and not yet where the job runs; `plan` with every task step reading them."""
    from ckpteval.cluster.data_push import datasets_dir, push_datasets
    from ckpteval.tasks.data_cache import default_cache_dir

    to_push = list(dict.fromkeys(ref for s in statuses for ref in s.to_push))
    if to_push:
        report(Note(f"pushing {len(to_push)} dataset(s) to {datasets_dir(compiled.profile)} ..."))
        pushed = push_datasets(remote, datasets_dir(compiled.profile), to_push, default_cache_dir())
        sent = f"{len(pushed.staged)} sent ({pushed.bytes_sent} bytes)"
        report(Note(f"datasets staged: {sent}, {len(pushed.present)} already there"))
    return with_data(compiled, plan, statuses)


def stage_secrets(job: PlannedJob, remote: Remote, report: Reporter) -> JobPlan:
    """Give a job that exports itself the user's W&B key, in an owner-only file where it runs (never in the
    script or the preview); its plan with the export step reading that file."""
    plan = job.plan
    stage_judge_key(job, remote)
    if not (plan.after_tasks and job.compiled.config.export.wandb.enabled):
        return plan
    from ckpteval.export.job import stage_wandb_key

    warn: Callable[[str], None] = lambda m: report(Note(m, "warning"))  # noqa: E731
    key_file = stage_wandb_key(remote, job.job_dir, secrets=job.compiled.secrets, on_note=warn)
    return add_export_step(plan, job.compiled, key_file=key_file)


def stage_export_cache(job: PlannedJob, remote: Remote) -> None:
    """Make the export cache of a vLLM/SGLang job on a Megatron checkpoint where the job runs: its steps'
    containers mount it, and a container's mount must exist before it starts."""
    if job.plan.deployment.export_step is None:
        return
    from ckpteval.job.hf_export import export_cache_dir

    remote.run(["mkdir", "-p", export_cache_dir(job.compiled)], check=True, timeout=60)


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


def stage_images(job: PlannedJob, plan: JobPlan, remote: Remote, report: Reporter) -> JobPlan:
    """Squash each container image of the job to a cached .sqsh where it runs (`enroot import` in a compute
    step of the profile's cluster); `plan` with its steps pointed at the files."""
    if not job.images:
        return plan
    from ckpteval.cluster.squash import ensure_squashed
    from ckpteval.cluster.submission import with_images

    squashed = ensure_squashed(job.images, job.profile, remote=remote, force=job.force_squash, on_event=report)
    return with_images(plan, squashed.mapping)
