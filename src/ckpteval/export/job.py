"""Export from inside a detached cluster job, where the CLI that submitted it is long gone.

Two pieces, wired into the Slurm submission:

- at submission, `stage_wandb_key(remote, job_dir)` finds the user's W&B key (environment or
  `wandb login`) and writes it to `<job_dir>/.secrets/wandb_api_key` (dir 0700, file 0600) through
  the Remote seam; the key is never on a command line, in the job script or in the preview;
- in the job script, after the tasks, the line `export_step_command(...)` returns runs
  `python -m ckpteval.export`, which collects the results from the job dir and exports them
  (reading the key from that file). Its failure never fails the job.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ckpteval.export.credentials import (  # stage_wandb_key: named here too, where the job's pieces are
    key_file_path,
    stage_wandb_key,
    wandb_base_url,
    wandb_mode,
)

if TYPE_CHECKING:
    from ckpteval.config.compile import CompiledConfig
    from ckpteval.job.plan import JobPlan


def without_credentials(argv: Sequence[str]) -> list[str]:
    """`argv` run with every credential variable removed from its environment (`env -u ...`).

    For `sbatch` run through a local tunnel: sbatch copies the submitting environment into the job
    (and into Slurm's spool), and the key must reach the job only through its key file.
    """
    from ckpteval.config.secrets import CREDENTIAL_ENV_VARS

    unset = [word for name in CREDENTIAL_ENV_VARS for word in ("-u", name)]
    return ["env", *unset, *argv]


def export_step_command(
    python: str,
    job_dir: str,
    *,
    invocation: str,
    tasks: Sequence[tuple[str, str]] = (),
    key_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The job script line that exports the finished job's results (a failure is reported, not fatal).

    `tasks` are (task name, "tasks/<dir>") pairs, for collecting results when results.json is not
    written yet. WANDB_MODE and WANDB_BASE_URL of the submitting environment (`environ`) travel as
    arguments, so an offline submission gives an offline run; the key travels only as `key_file`.
    """
    env = os.environ if environ is None else environ
    argv = [python, "-m", "ckpteval.export", "--job-dir", job_dir, "--invocation", invocation]
    if key_file:
        argv += ["--wandb-key-file", key_file]
    if env.get("WANDB_MODE"):
        argv += ["--wandb-mode", wandb_mode(env)]
    base_url = wandb_base_url(env)
    if base_url:
        argv += ["--wandb-base-url", base_url]
    for name, directory in tasks:
        argv += ["--task", f"{name}={directory}"]
    retry = f"[ckpteval] export failed; the results are in {job_dir}; retry with: evaluate export {invocation}"
    return f"{shlex.join(argv)} || echo {shlex.quote(retry)}"


__all__ = ["export_step_command", "key_file_path", "stage_wandb_key", "without_credentials"]


def with_planned_export_step(plan: JobPlan, compiled: CompiledConfig, python: str) -> JobPlan:
    """`plan` with its export step as planned before anything is staged (what a dry run shows): reading the W&B
    key where the job will find it, when W&B export is on and online (`stage_wandb_key` writes it there)."""
    wandb_online = compiled.config.export.wandb.enabled and wandb_mode(os.environ) == "online"
    return with_export_step(plan, compiled, python, key_file=key_file_path(plan.job_dir) if wandb_online else None)


def with_export_step(plan: JobPlan, compiled: CompiledConfig, python: str, *, key_file: str | None) -> JobPlan:
    """`plan` ending with the in-job export (W&B, MLflow) when the config enables one.

    The job exports its own results as it ends, so a detached job needs no CLI waiting for it; the
    submitting environment's WANDB_MODE/WANDB_BASE_URL travel as arguments and the key only as `key_file`.
    """
    from ckpteval.export.invocation import enabled_destinations

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
