"""The planned job of a new invocation: what every backend is handed to preview, stage and start.

Pure planning (nothing written, nothing contacted): the job directory and the toolchain where the job runs,
the plan (one deployment, every task against it), the container images to squash, and for a job that
exports its own results the export step (reading the W&B key from where `stage_secrets` will put it).
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ckpteval.config.compile import CompiledConfig
from ckpteval.config.executors import Launcher
from ckpteval.config.profiles import Profile
from ckpteval.job.build import Toolchain, build_plan
from ckpteval.job.plan import JobPlan

if TYPE_CHECKING:
    from ckpteval.checkpoint.description import CheckpointDescription
    from ckpteval.cluster.images import ImageRef


@dataclass
class PlannedJob:
    """A new invocation's job, planned for where it runs."""

    compiled: CompiledConfig
    invocation: str
    job_dir: str  # absolute, where the job runs
    plan: JobPlan
    images: list[ImageRef]  # registry images its steps run in (squashed before submission)
    force_squash: bool = False
    description: CheckpointDescription | None = field(default=None)  # set once the checkpoint is checked
    toolchain: Toolchain | None = None
    launcher: Launcher = "processes"
    exports_itself: bool = False

    @classmethod
    def make(
        cls,
        compiled: CompiledConfig,
        invocation: str,
        *,
        job_dir: str,
        toolchain: Toolchain,
        launcher: Launcher,
        exports_itself: bool,
        force_squash: bool = False,
    ) -> PlannedJob:
        """The job of `compiled` in `job_dir`; with `exports_itself`, the export step after the tasks."""
        from ckpteval.cluster.submission import job_images

        plan = _plan(compiled, invocation, job_dir, toolchain, launcher, exports_itself=exports_itself, pinned=None)
        return cls(
            compiled,
            invocation,
            job_dir,
            plan,
            job_images(plan),
            force_squash=force_squash,
            toolchain=toolchain,
            launcher=launcher,
            exports_itself=exports_itself,
        )

    def described(self, description: CheckpointDescription) -> None:
        """Keep the checkpoint's description, and plan again to serve the iteration it describes: the job serves
        that one (pinned), whatever the tracker names when the job starts (a training that saves while the
        job waits in a queue moves it)."""
        self.description = description
        pinned = pinned_iteration(description)
        # a Hugging Face directory needs no export step (one planned before it was read, on a cluster)
        unexported = description.layout == "huggingface" and self.plan.deployment.export_step is not None
        if self.toolchain is None or not (unexported or (pinned and pinned != self.plan.deployment.pinned_iteration)):
            return
        self.plan = _plan(
            self.compiled,
            self.invocation,
            self.job_dir,
            self.toolchain,
            self.launcher,
            exports_itself=self.exports_itself,
            pinned=pinned,
            layout=description.layout,
        )

    @property
    def profile(self) -> Profile:
        return self.compiled.profile


def pinned_iteration(description: CheckpointDescription) -> str | None:
    """The iteration a described Megatron checkpoint is served at ("1000", "release"); None for a Hugging Face
    model directory (no iterations)."""
    from ckpteval.checkpoint.layout import iteration_label

    if description.layout == "huggingface":
        return None
    return iteration_label(description.iteration)


def _plan(
    compiled: CompiledConfig,
    invocation: str,
    job_dir: str,
    toolchain: Toolchain,
    launcher: Launcher,
    *,
    exports_itself: bool,
    pinned: str | None,
    layout: str | None = None,
) -> JobPlan:
    plan = build_plan(
        compiled,
        invocation=invocation,
        job_dir=job_dir,
        toolchain=toolchain,
        launcher=launcher,
        pinned=pinned,
        checkpoint_layout=layout,
    )
    if exports_itself:
        from ckpteval.export.job import with_planned_export_step

        plan = with_planned_export_step(plan, compiled, compiled.profile.part.step_python())
    return plan


def add_export_step(plan: JobPlan, compiled: CompiledConfig, *, key_file: str | None) -> JobPlan:
    """`plan` with the step that exports the results from inside the job, after the tasks (W&B, MLflow)."""
    from ckpteval.export.job import with_export_step

    return with_export_step(plan, compiled, compiled.profile.part.step_python(), key_file=key_file)
