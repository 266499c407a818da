"""What the Slurm backend prepares before it submits a job: the job directory on the cluster, the sbatch
request, the images to squash (and the plan pointed at their .sqsh files), the in-job export step, the
check that no secret is written into the job's files, and their upload.

Pure functions of the compiled config and plan, except `upload_job_files` (through the Remote seam).
`ckpteval.execution.slurm` puts them in order.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING

from ckpteval.cluster.images import ImageRef, is_squashable
from ckpteval.cluster.sbatch import SbatchSpec, tunnel_dir_for
from ckpteval.config.compile import CompiledConfig
from ckpteval.config.schema import SlurmExecution
from ckpteval.errors import ConfigError
from ckpteval.invocation.jobdir import JobDir
from ckpteval.job.plan import DeploymentPlan, JobPlan, Step
from ckpteval.job.script import render_job_script

if TYPE_CHECKING:
    from ckpteval.cluster.remote import Remote


def remote_job_dir(compiled: CompiledConfig, invocation: str) -> str:
    """`<execution.output_dir>/<invocation>` on the cluster (config validation, `check_cluster_paths`, has
    made sure the profile has an absolute `remote_job_dir`)."""
    execution = compiled.config.execution
    if not isinstance(execution, SlurmExecution):
        raise ConfigError(f"Profile [{compiled.profile.name}] does not run on Slurm.")
    return posixpath.join(posixpath.normpath(execution.output_dir), invocation)


def sbatch_spec(compiled: CompiledConfig, invocation: str, job_dir: str) -> SbatchSpec:
    """The Slurm request of the invocation's job: the profile's resources (nodes: enough for the deployments,
    each role's on nodes of its own: the model's, then a judge's)."""
    execution = compiled.config.execution
    assert isinstance(execution, SlurmExecution)
    deployment_nodes = deployment_node_count(compiled)
    return SbatchSpec(
        invocation=invocation,
        job_script=JobDir(job_dir).join(JobDir.SCRIPT),
        tunnel_dir=tunnel_dir_for(compiled.profile.part.files_dir() or ""),
        account=execution.account,
        partition=execution.partition,
        nodes=max(execution.num_nodes, deployment_nodes),
        gpus_per_node=execution.gpus_per_node,
        time=execution.walltime,
        extra_flags=dict(execution.sbatch_extra_flags),
    )


def deployment_node_count(compiled: CompiledConfig) -> int:
    """Nodes the job's deployments take on Slurm: each role's own (`num_nodes`, 1 for a server without it),
    one after the other (`ckpteval.job.build` places them so)."""
    from ckpteval.config.schema import NoDeployment
    from ckpteval.job.roles import deployed_roles

    sections = [s for _role, s in deployed_roles(compiled.config) if not isinstance(s, NoDeployment)]
    return max(1, sum(int(getattr(s, "num_nodes", 1)) for s in sections))


def job_images(plan: JobPlan) -> list[ImageRef]:
    """Every registry image the job's steps run in (each role's deployment's: the model's, a judge's; each
    task's), for squashing."""
    refs = []
    for role, dep in plan.deployments.items():
        if dep.step and dep.step.image and is_squashable(dep.step.image):
            where = "deployment" if role == "model" else role  # the config section that names the image
            refs.append(ImageRef(dotpath=f"{where}.image", image=dep.step.image))
    export = plan.deployment.export_step  # ckpteval's image (the profile's), exporting for vLLM/SGLang
    if export is not None and export.image and is_squashable(export.image):
        refs.append(ImageRef(dotpath="run.env.container_image (the export step)", image=export.image))
    for i, task in enumerate(plan.tasks):
        image = task.runs[0].step.image  # every run (repeat) of a task uses the task's container
        if image and is_squashable(image):
            refs.append(ImageRef(dotpath=f"evaluation.tasks[{i}].container ({task.name})", image=image))
    return refs


def with_images(plan: JobPlan, mapping: dict[str, str]) -> JobPlan:
    """`plan` with each step's image replaced by its .sqsh file (images not in `mapping` stay)."""

    def swap(step: Step) -> Step:
        return dataclasses.replace(step, image=mapping.get(step.image, step.image)) if step.image else step

    def swapped(deployment: DeploymentPlan) -> DeploymentPlan:
        if deployment.step is not None:
            deployment = dataclasses.replace(deployment, step=swap(deployment.step))
        if deployment.export_step is not None:
            deployment = dataclasses.replace(deployment, export_step=swap(deployment.export_step))
        return deployment

    tasks = tuple(
        dataclasses.replace(t, runs=tuple(dataclasses.replace(r, step=swap(r.step)) for r in t.runs))
        for t in plan.tasks
    )
    others = tuple(swapped(d) for d in plan.others)
    return dataclasses.replace(plan, deployment=swapped(plan.deployment), tasks=tasks, others=others)


def check_no_secrets(compiled: CompiledConfig, plan: JobPlan) -> None:
    """Refuse to write a secret value (W&B key, tokens) into the job script or a run config."""
    import yaml

    texts = {JobDir.SCRIPT: render_job_script(plan, launcher="srun-containers")}
    texts.update({f"{t.dir}/{r.layout.run_config}": yaml.safe_dump(r.run_config) for t in plan.tasks for r in t.runs})
    for name, text in texts.items():
        if compiled.secrets.redact(text) != text:
            raise ConfigError(
                f"A secret value (a key or token) would be written into {name} on the cluster.",
                hint="Do not put credentials in env_vars or the config; the job reads them from files only its "
                "owner can read (W&B: `wandb login` on the cluster).",
            )


def upload_job_files(remote: Remote, job_dir: str, files: dict[str, str], hook_dir: Path | None) -> None:
    """Write the job's files into `job_dir` on the cluster (each atomically), and the harness hook."""
    where = JobDir(job_dir)
    remote.run(["mkdir", "-p", job_dir, where.join(JobDir.LOGS), where.join(JobDir.STATE)])
    for rel, text in files.items():
        remote.write_text_atomic(where.join(rel), text, mode=0o755 if rel == JobDir.SCRIPT else 0o644)
    if hook_dir is not None and hook_dir.is_dir():
        for path in sorted(hook_dir.rglob("*.py")):
            rel = path.relative_to(hook_dir).as_posix()
            remote.write_text_atomic(where.join(f"{JobDir.HOOK}/{rel}"), path.read_text(encoding="utf-8"))


def local_hook_dir() -> Path | None:
    from ckpteval.tasks.client import hook_dir

    path = Path(hook_dir())
    return path if path.is_dir() else None


def with_staged_data(plan: JobPlan, data_root: str, staged_tasks: set[str]) -> JobPlan:
    """`plan` for compute nodes without internet: every task step mounts the staged dataset cache
    `data_root` read-only with the hub switched off; the tasks in `staged_tasks` (by name) read their real
    datasets from it (`ckpteval.cluster.data_push.job_data_setup`), the others fall back to packaged data."""
    from ckpteval.cluster.data_push import job_data_setup

    mount = f"{data_root}:{data_root}:ro"

    def swap(task_dir: str, step: Step, staged: bool) -> Step:
        prefix, env = job_data_setup(data_root, task_dir)
        if not staged:
            env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
            prefix = ""
        mounts = (*step.mounts, mount) if step.image else step.mounts
        return dataclasses.replace(step, command=prefix + step.command, env={**step.env, **env}, mounts=mounts)

    tasks = tuple(
        dataclasses.replace(
            t,
            runs=tuple(
                dataclasses.replace(r, step=swap(JobDir(plan.job_dir).join(t.dir), r.step, t.name in staged_tasks))
                for r in t.runs
            ),
        )
        for t in plan.tasks
    )
    return dataclasses.replace(plan, tasks=tasks)
