"""Run an invocation on a Slurm cluster: one job that deploys the model once and runs every task against it.

`SlurmLaunch.run` does, in order (one SSH connection for all of it, reopened if it drops):
1. connect (a clear error for an unknown host key, failed login, unreachable host) and check the
   partition and account against the cluster (before the slow nemo-run import);
2. squash every container image of the job (deployment, each task's eval-factory image) to a cached
   .sqsh and point the job's steps at the files;
3. render the job files (job.sh, run configs, config.yaml, job.yaml) — refusing any secret value in
   them — and upload them, with the harness's offline-data hook, to `<output_dir>/<invocation>/`;
4. record the invocation locally (so status/logs/cancel/results work from any shell), then submit
   through nemo-run (`SlurmExecutor`, see `ckpteval.cluster.sbatch` for the shape of the job);
5. `--batch`: print the invocation id and the commands that follow it up, and return;
   `--run`: follow the job (progress and its log), fetch the results, print the table
   (`ckpteval.cluster.attach`).

A job that was cancelled, preempted or ran out of time is resubmitted with `resume_invocation`: the
same job script in the same directory, which skips finished tasks (`.done`) and replays cached
responses of the interrupted one.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.cluster.images import ImageRef, is_squashable
from ckpteval.cluster.sbatch import SbatchSpec, render_sbatch_preview, tunnel_dir_for
from ckpteval.cluster.session import ClusterSession
from ckpteval.config.compile import CompiledConfig
from ckpteval.config.profiles import Profile
from ckpteval.config.schema import SlurmExecution
from ckpteval.errors import ClusterError, ConfigError
from ckpteval.job.build import build_plan, slurm_toolchain
from ckpteval.job.files import job_files
from ckpteval.job.invocation import InvocationRecord, now_iso, write_text_atomic
from ckpteval.job.plan import JobPlan, Step
from ckpteval.job.script import render_job_script

if TYPE_CHECKING:
    from rich.console import Console

    from ckpteval.cluster.remote import Remote
    from ckpteval.cluster.slurm import ClusterFacts


def remote_job_dir(compiled: CompiledConfig, invocation: str) -> str:
    """`<execution.output_dir>/<invocation>` on the cluster (it must be an absolute path there)."""
    execution = compiled.config.execution
    if not isinstance(execution, SlurmExecution):
        raise ConfigError(f"Profile [{compiled.profile.name}] does not run on Slurm.")
    if not compiled.profile.remote_job_dir:
        raise ConfigError(
            f"Profile [{compiled.profile.name}] has no `remote_job_dir`, where jobs and results go on the cluster.",
            hint='Set remote_job_dir = "/lustre/.../ckpteval" (a directory you can write on the cluster) in env.toml.',
        )
    output_dir = execution.output_dir
    if not output_dir.startswith("/"):
        raise ConfigError(
            f"execution.output_dir must be an absolute path on the cluster, not {output_dir!r}.",
            hint="Set remote_job_dir in the env.toml profile to an absolute path (~ and $HOME are not expanded).",
        )
    return posixpath.join(posixpath.normpath(output_dir), invocation)


def sbatch_spec(compiled: CompiledConfig, invocation: str, job_dir: str) -> SbatchSpec:
    """The Slurm request of the invocation's job: the profile's resources (nodes: enough for the deployment)."""
    execution = compiled.config.execution
    assert isinstance(execution, SlurmExecution)
    deployment_nodes = getattr(compiled.config.deployment, "num_nodes", 1)
    return SbatchSpec(
        invocation=invocation,
        job_script=posixpath.join(job_dir, "job.sh"),
        tunnel_dir=tunnel_dir_for(compiled.profile.remote_job_dir or ""),
        account=execution.account,
        partition=execution.partition,
        nodes=max(execution.num_nodes, deployment_nodes),
        gpus_per_node=execution.gpus_per_node,
        time=execution.walltime,
        extra_flags=dict(execution.sbatch_extra_flags),
    )


def job_images(plan: JobPlan) -> list[ImageRef]:
    """Every registry image the job's steps run in (the deployment's, each task's), for squashing."""
    refs = []
    if plan.deployment.step and plan.deployment.step.image and is_squashable(plan.deployment.step.image):
        refs.append(ImageRef(dotpath="deployment.image", image=plan.deployment.step.image))
    for i, task in enumerate(plan.tasks):
        image = task.runs[0].step.image  # every run (repeat) of a task uses the task's container
        if image and is_squashable(image):
            refs.append(ImageRef(dotpath=f"evaluation.tasks[{i}].container ({task.name})", image=image))
    return refs


def with_images(plan: JobPlan, mapping: dict[str, str]) -> JobPlan:
    """`plan` with each step's image replaced by its .sqsh file (images not in `mapping` stay)."""

    def swap(step: Step) -> Step:
        return dataclasses.replace(step, image=mapping.get(step.image, step.image)) if step.image else step

    deployment = plan.deployment
    if deployment.step is not None:
        deployment = dataclasses.replace(deployment, step=swap(deployment.step))
    tasks = tuple(
        dataclasses.replace(t, runs=tuple(dataclasses.replace(r, step=swap(r.step)) for r in t.runs))
        for t in plan.tasks
    )
    return dataclasses.replace(plan, deployment=deployment, tasks=tasks)


def with_export_step(plan: JobPlan, compiled: CompiledConfig, python: str, *, key_file: str | None) -> JobPlan:
    """`plan` ending with the in-job export (W&B, MLflow) when the config enables one.

    The job exports its own results as it ends, so a detached job needs no CLI waiting for it; the
    submitting environment's WANDB_MODE/WANDB_BASE_URL travel as arguments and the key only as `key_file`.
    """
    from ckpteval.export.invocation import enabled_destinations
    from ckpteval.export.job import export_step_command

    if not enabled_destinations(compiled.config.export):
        return dataclasses.replace(plan, after_tasks=())
    step = export_step_command(
        python,
        plan.job_dir,
        invocation=plan.invocation,
        tasks=[(t.name, t.dir) for t in plan.tasks],
        key_file=key_file,
    )
    return dataclasses.replace(plan, after_tasks=('say "exporting the results"', step))


def check_no_secrets(compiled: CompiledConfig, plan: JobPlan) -> None:
    """Refuse to write a secret value (W&B key, tokens) into the job script or a run config."""
    import yaml

    texts = {"job.sh": render_job_script(plan, launcher="slurm")}
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
    remote.run(["mkdir", "-p", job_dir, posixpath.join(job_dir, "logs"), posixpath.join(job_dir, "state")])
    for rel, text in files.items():
        remote.write_text_atomic(posixpath.join(job_dir, rel), text, mode=0o755 if rel == "job.sh" else 0o644)
    if hook_dir is not None and hook_dir.is_dir():
        for path in sorted(hook_dir.rglob("*.py")):
            rel = path.relative_to(hook_dir).as_posix()
            remote.write_text_atomic(posixpath.join(job_dir, "hook", rel), path.read_text(encoding="utf-8"))


def _local_hook_dir() -> Path | None:
    from ckpteval.tasks.client import hook_dir

    path = Path(hook_dir())
    return path if path.is_dir() else None


@dataclass
class SlurmLaunch:
    """An invocation that runs as one Slurm job, submitted with nemo-run."""

    compiled: CompiledConfig
    invocation: str
    force_squash: bool = False

    def __post_init__(self) -> None:
        self.profile: Profile = self.compiled.profile
        self.job_dir = remote_job_dir(self.compiled, self.invocation)
        self.toolchain = slurm_toolchain(self.profile.python, self.job_dir)
        self.plan: JobPlan = build_plan(
            self.compiled, invocation=self.invocation, job_dir=self.job_dir, toolchain=self.toolchain, launcher="slurm"
        )
        self.spec = sbatch_spec(self.compiled, self.invocation, self.job_dir)
        self.images = job_images(self.plan)
        self.plan = with_export_step(self.plan, self.compiled, self.profile.python, key_file=self._planned_key_file())

    def _planned_key_file(self) -> str | None:
        """Where the job will read the W&B key (shown by a dry run), when W&B export is on and online."""
        from ckpteval.export.credentials import key_file_path, wandb_mode

        if not self.compiled.config.export.wandb.enabled or wandb_mode(os.environ) != "online":
            return None
        return key_file_path(self.job_dir)

    def preview_panels(self, *, force_squash: bool = False, check: bool = False) -> list[Any]:
        """The sbatch script nemo-run will submit, the job script, and the squash plan (cluster not asked
        unless `check`)."""
        from ckpteval.cluster.squash import plan_squash
        from ckpteval.cluster.squash_view import squash_plan_panel
        from ckpteval.config.preview import PreviewPanel

        self.force_squash = self.force_squash or force_squash
        squash = plan_squash(self.images, self.profile, check=check, force=self.force_squash)
        from ckpteval.cluster.export_deploy import preview_entry_point  # Export-Deploy's script (issue 17)

        plan, entry_panel = preview_entry_point(self.plan, self.compiled, squash, check=check)
        # the script as it will run: images shown as their .sqsh files
        script = render_job_script(with_images(plan, squash.mapping), launcher="slurm")
        return [
            PreviewPanel(
                title="sbatch script (submitted by nemo-run)", body=render_sbatch_preview(self.spec), language="bash"
            ),
            PreviewPanel(title=f"job script ({self.spec.job_script})", body=script, language="bash"),
            PreviewPanel(title="squash plan", body="", renderable=squash_plan_panel(squash)),
            *([entry_panel] if entry_panel else []),
        ]

    def record(self) -> InvocationRecord:
        """The local record of the invocation (saved just before submission)."""
        from ckpteval.cluster.manage import local_job_copy

        record = InvocationRecord(
            id=self.invocation,
            created=now_iso(),
            mode=self.compiled.mode,
            profile=self.profile.name,
            executor="slurm",
            job_dir=self.job_dir,
            tasks=[t.name for t in self.plan.tasks],
            command_line=["evaluate", *(self.compiled.secrets.redact(o) for o in self.compiled.request.overrides)],
            env_file=str(self.compiled.env_file) if self.compiled.env_file else None,
            extra={
                "task_dirs": {t.name: t.dir for t in self.plan.tasks},
                "task_repeats": {t.name: t.repeats for t in self.plan.tasks if t.repeats},
                "connection": self.compiled.secrets.redact_data(dataclasses.asdict(self.profile)),
                "sbatch": dataclasses.asdict(self.spec),
                "model": getattr(self.compiled.config.deployment, "checkpoint_path", None),
                "label": self.compiled.config.run.name,
                "slurm_job_ids": [],
            },
        )
        record.local_results_dir = str(local_job_copy(record))
        return record

    def run(self, record: InvocationRecord) -> int:
        """Squash, upload, record, submit; then follow (`--run`) or return at once (`--batch`)."""
        from rich.console import Console

        from ckpteval.cluster.attach import attach, print_submitted
        from ckpteval.cluster.preflight import check_builtin_python
        from ckpteval.cluster.slurm import check_request, cluster_facts
        from ckpteval.cluster.squash import ensure_squashed

        console = Console(stderr=True, highlight=False)
        check_no_secrets(self.compiled, self.plan)  # before anything is contacted
        with ClusterSession(self.profile, on_reconnect=lambda m: console.print(f"[yellow]{m}[/]")) as session:
            remote = session.remote  # connects: unknown host key, failed login, unreachable host end here
            console.print(f"[dim]connected to {remote.description}[/]")
            facts = cluster_facts(remote)
            check_request(facts, partition=self.spec.partition, account=self.spec.account, where=remote.description)
            check_builtin_python(remote, self.plan, self.profile)  # the job's python imports ckpteval there
            plan = self.plan
            if plan.after_tasks and self.compiled.config.export.wandb.enabled:
                from ckpteval.export.job import stage_wandb_key

                # the key goes to an owner-only file on the cluster (never into the script or the preview)
                key_file = stage_wandb_key(remote, self.job_dir, secrets=self.compiled.secrets)
                plan = with_export_step(plan, self.compiled, self.profile.python, key_file=key_file)
            if self.images:
                from ckpteval.cli.squash import SquashProgress

                with SquashProgress(console) as progress:
                    squashed = ensure_squashed(
                        self.images, self.profile, remote=remote, force=self.force_squash, on_event=progress.on_event
                    )
                plan = with_images(plan, squashed.mapping)
            from ckpteval.cluster.export_deploy import resolve_for_run  # probe/cache Export-Deploy's script

            plan, entry_note = resolve_for_run(plan, self.compiled, remote)
            if entry_note:
                console.print(f"[dim]{entry_note}[/]")
            files = job_files(self.compiled, plan, launcher="slurm")
            hook = _local_hook_dir() if self.toolchain.hook_dir else None
            upload_job_files(remote, self.job_dir, files, hook)
            record.save()
            for name in ("config.yaml", "job.yaml", "job.sh"):
                write_text_atomic(record.path / name, files[name])
            submit_job(record, self.spec, self.profile, console=console, facts=facts)
            if self.compiled.mode == "batch":
                print_submitted(record, console)
                return 0
            return attach(record, session, console)


def submit_job(
    record: InvocationRecord,
    spec: SbatchSpec,
    profile: Profile,
    *,
    console: Console,
    facts: ClusterFacts | None = None,
) -> None:
    """Submit the job through nemo-run and note its Slurm job id in the record (saved)."""
    from ckpteval.cluster.nemorun import submit

    console.print(f"[dim]submitting with nemo-run (job {spec.job_name}) ...[/]")
    try:
        submission = submit(spec, profile, log_path=record.path / "nemo-run.log", facts=facts)
    except ClusterError as exc:
        record.extra["submit_error"] = exc.message
        record.save()
        raise
    record.slurm_job_id = submission.job_id
    record.nemo_run_experiment = submission.experiment_id
    record.extra["nemo_run_dir"] = submission.nemo_run_dir
    record.extra.setdefault("slurm_job_ids", []).append(submission.job_id)
    record.extra.pop("submit_error", None)
    record.extra.pop("final", None)  # a new job: its status is asked again
    record.save()
    if submission.sbatch_script:
        write_text_atomic(record.path / "sbatch.sh", submission.sbatch_script)


def resume_invocation(record: InvocationRecord, *, attach_to: bool = False) -> int:
    """Run a stopped invocation's job again: finished tasks are skipped, cached responses replayed.

    Slurm: the same job script is resubmitted (followed like `--run` with `attach_to`); this machine:
    the job runs again in its directory, followed. Refused while the job is still queued or running.
    """
    from rich.console import Console

    from ckpteval.cluster.attach import attach, print_submitted
    from ckpteval.cluster.manage import record_profile
    from ckpteval.cluster.slurm import job_state

    if record.executor == "local":
        from ckpteval.job.local import resume_here

        return resume_here(record)  # always attached: the job runs as a child of this process
    sbatch = record.extra.get("sbatch")
    if not sbatch:
        raise ConfigError(f"Invocation {record.id} has no recorded Slurm request to resubmit.")
    spec = SbatchSpec(**sbatch)
    profile = record_profile(record)
    console = Console(stderr=True, highlight=False)
    with ClusterSession(profile, on_reconnect=lambda m: console.print(f"[yellow]{m}[/]")) as session:
        remote = session.remote
        if record.slurm_job_id:
            state = job_state(remote, record.slurm_job_id)
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
        submit_job(record, spec, profile, console=console)
        if not attach_to:
            print_submitted(record, console, resumed=True)
            return 0
        return attach(record, session, console)
