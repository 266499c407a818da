"""The staging steps an executor contributes to the pipeline (`JobBackend.staging`): what a job that runs on
another machine needs there before it starts.

A step takes the planned job, its plan so far and the host it goes to, and returns the plan that reads what it
staged: `stage_images` (container images squashed to cached .sqsh files where the job runs: an executor whose
steps run in images), `stage_data` (datasets of an offline machine: pushed from the local dataset cache into
`${remote_job_dir}/datasets`, a task whose data is neither there nor fetched refused). The pipeline runs the
steps it is given in order and names none of them.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from typing import TYPE_CHECKING

from ckpteval.config.compile import CompiledConfig
from ckpteval.execution.events import Note, Reporter
from ckpteval.job.plan import JobPlan

if TYPE_CHECKING:
    from ckpteval.cluster.remote import Remote
    from ckpteval.execution.backend import JobHost
    from ckpteval.execution.planned import PlannedJob
    from ckpteval.tasks.data_status import TaskDataStatus


def stage_images(job: PlannedJob, plan: JobPlan, host: JobHost, report: Reporter) -> JobPlan:
    """Squash each container image of the job to a cached .sqsh where it runs (`enroot import` in a compute
    step of the profile's cluster); `plan` with its steps pointed at the files."""
    if not job.images:
        return plan
    from ckpteval.cluster.squash import ensure_squashed
    from ckpteval.cluster.submission import with_images

    squashed = ensure_squashed(job.images, job.profile, remote=host.remote, force=job.force_squash, on_event=report)
    return with_images(plan, squashed.mapping)


def stage_data(job: PlannedJob, plan: JobPlan, host: JobHost, report: Reporter) -> JobPlan:
    """On a machine without internet (`compute_internet = false`): refuse a task whose data cannot be read
    there, push the datasets fetched here and not yet there; `plan` with every task step reading them."""
    statuses = data_statuses(job.compiled, host.remote, report=host.description)
    if statuses is None:
        return plan
    from ckpteval.cluster.data_push import datasets_dir, push_datasets
    from ckpteval.tasks.data_cache import default_cache_dir

    compiled = job.compiled
    to_push = list(dict.fromkeys(ref for s in statuses for ref in s.to_push))
    if to_push:
        report(Note(f"pushing {len(to_push)} dataset(s) to {datasets_dir(compiled.profile)} ..."))
        pushed = push_datasets(host.remote, datasets_dir(compiled.profile), to_push, default_cache_dir())
        sent = f"{len(pushed.staged)} sent ({pushed.bytes_sent} bytes)"
        report(Note(f"datasets staged: {sent}, {len(pushed.present)} already there"))
    return with_data(compiled, plan, statuses)


def data_statuses(
    compiled: CompiledConfig, remote: Remote | None, *, report: str | None = None
) -> list[TaskDataStatus] | None:
    """Per task, whether its datasets are staged where the job runs (asked on `remote`, one round trip),
    fetched here (pushed at submission), or missing; None when the job's machine reaches the hub.

    Without `remote` the machine is not asked. With `report` (where the job runs, in words) a task whose
    data the offline job cannot read is refused (ConfigError)."""
    if not compiled.profile.part.data_offline() or not compiled.config.execution.on_cluster:
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


def with_data(compiled: CompiledConfig, plan: JobPlan, statuses: list[TaskDataStatus]) -> JobPlan:
    """`plan` with every task step reading the staged datasets (the staged ones' real data)."""
    from ckpteval.cluster.data_push import datasets_dir
    from ckpteval.cluster.submission import with_staged_data

    staged = {s.task for s in statuses if s.staged}
    return with_staged_data(plan, datasets_dir(compiled.profile), staged)
