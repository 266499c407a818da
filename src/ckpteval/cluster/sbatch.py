"""The Slurm job of an invocation as nemo-run submits it: its `#SBATCH` request and its one top-level step.

nemo-run's `SlurmExecutor` writes an sbatch script whose body wraps the command in `srun` (one task per
node by default). Our job script is not a worker to replicate: it is the orchestrator that starts the
deployment and the task clients as job steps itself (see `ckpteval.job.script`). So the executor gets
`srun_args` that make its step run the script once, on the first node, sharing the allocation:

    srun ... --nodes=1 --ntasks=1 --overlap bash <job_dir>/job.sh

`--overlap` lets the steps the script starts share the CPUs, memory and GPUs this step holds. The
alternatives are worse: `setup_lines` could `exec` the script from the batch step, but would leave
dead code after it and an experiment nemo-run believes is something else; plain `sbatch` would drop
nemo-run, which the design asks for (its experiment records and executor configuration).

Everything here is pure (no nemo-run import: it costs ~12-25 s), so `--dry-run` can show the script.
`render_sbatch_preview` mirrors what nemo-run 0.11 writes for these settings; a unit test holds the two
together.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field
from typing import Any

from ckpteval.errors import ConfigError

NEMO_RUN_SUBDIR = "nemo-run"
EXPERIMENT_TITLE = "ckpteval"
JOB_NAME_PREFIX = "ckpteval-"
TOP_STEP_SRUN_ARGS = ("--nodes=1", "--ntasks=1", "--overlap")
# nemo-run's own #SBATCH settings for every job (what it does not take from us)
_NEMO_RUN_FIXED = {"ntasks_per_node": 1, "open_mode": "append"}


@dataclass(frozen=True)
class SbatchSpec:
    """The resources and identity of an invocation's one Slurm job."""

    invocation: str
    job_script: str  # absolute path of job.sh on the cluster
    tunnel_dir: str  # where nemo-run keeps its experiment files on the cluster
    account: str | None
    partition: str | None
    nodes: int
    gpus_per_node: int
    time: str
    extra_flags: dict[str, Any] = field(default_factory=dict)

    @property
    def job_name(self) -> str:
        """The Slurm job name: `ckpteval-<invocation>` (what squeue and sacct show)."""
        return JOB_NAME_PREFIX + self.invocation

    @property
    def gres(self) -> str | None:
        """`gpu:N`, or None for a CPU-only job."""
        return f"gpu:{self.gpus_per_node}" if self.gpus_per_node > 0 else None

    def command(self) -> str:
        """The command nemo-run's step runs: the job script."""
        return f"bash {shlex.quote(self.job_script)}"


def tunnel_dir_for(remote_job_dir: str) -> str:
    """nemo-run's experiment files on the cluster: `<remote_job_dir>/nemo-run`.

    nemo-run 0.11 rewrites every `/nemo_run` in a container-less sbatch script to the job's directory
    (its in-container mount point), so a path containing `/nemo_run` would be mangled: refused here.
    """
    if "/nemo_run" in remote_job_dir:
        raise ConfigError(
            f"remote_job_dir {remote_job_dir!r} contains '/nemo_run', which nemo-run rewrites in the scripts it "
            "submits (it is the mount point of its own job directory).",
            hint="Choose a remote_job_dir without a path component named nemo_run.",
        )
    return posixpath.join(posixpath.normpath(remote_job_dir), NEMO_RUN_SUBDIR)


def extra_sbatch_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """`execution.sbatch_extra_flags` as nemo-run's `additional_parameters`: false/None flags dropped
    (sbatch has no `--exclusive=False`), keys in snake case (nemo-run turns `_` into `-`)."""
    out: dict[str, Any] = {}
    for key, value in flags.items():
        if value is None or value is False:
            continue
        if not isinstance(value, (str, int, float, bool)):
            raise ConfigError(
                f"sbatch flag {key!r}: {value!r} is not a string, number or true.",
                hint='Give each sbatch flag one value, e.g. sbatch_flags = { exclusive = true, qos = "high" }.',
            )
        name = str(key).lstrip("-").replace("-", "_")
        if name in ("job_name", "output", "error", "parsable", "wrap"):
            raise ConfigError(
                f"sbatch flag {key!r} is set by ckpteval itself.", hint=f"Remove {key!r} from sbatch_flags."
            )
        out[name] = value
    return out


def executor_settings(spec: SbatchSpec) -> dict[str, Any]:
    """Keyword arguments of nemo-run's `SlurmExecutor` for `spec` (all but tunnel and packager)."""
    return {
        "account": spec.account or "ckpteval",  # nemo-run requires one; sbatch's default is used when unset
        "partition": spec.partition,
        "nodes": spec.nodes,
        "ntasks_per_node": 1,
        "gres": spec.gres,
        "time": spec.time,
        "job_name_prefix": JOB_NAME_PREFIX,
        "srun_args": list(TOP_STEP_SRUN_ARGS),
        "additional_parameters": extra_sbatch_flags(spec.extra_flags) or None,
        "container_image": None,  # the job script runs on the node; its steps get containers
        "poll_estimated_start_time": False,  # a background thread printing; `evaluate status` says it
    }


def sbatch_flag(key: str, value: Any) -> str:
    """One `#SBATCH` line the way nemo-run writes it (`--key=value`, quoted; `--key` for true)."""
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def sbatch_flags(spec: SbatchSpec, *, log_dir: str) -> list[str]:
    """The `#SBATCH` lines of the job, sorted by name like nemo-run's."""
    params: dict[str, Any] = {
        "job_name": spec.job_name,
        "nodes": spec.nodes,
        "time": spec.time,
        "output": posixpath.join(log_dir, f"sbatch_{spec.job_name}_%j.out"),
        **_NEMO_RUN_FIXED,
    }
    if spec.account:
        params["account"] = spec.account
    if spec.partition:
        params["partition"] = spec.partition
    if spec.gres:
        params["gres"] = spec.gres
    params.update(extra_sbatch_flags(spec.extra_flags))
    return [sbatch_flag(k, params[k]) for k in sorted(params)]


def render_sbatch_preview(spec: SbatchSpec) -> str:
    """What nemo-run will submit for `spec`: its #SBATCH request and the step that runs the job script.

    The experiment directory is only known at submission; it is shown as `<experiment>`.
    """
    log_dir = posixpath.join(spec.tunnel_dir, EXPERIMENT_TITLE, "<experiment>", spec.invocation)
    lines = [
        "#!/bin/bash",
        "# written and submitted by nemo-run (SlurmExecutor): sbatch --requeue --parsable <this script>",
        *sbatch_flags(spec, log_dir=log_dir),
        "",
        "# ... nemo-run's setup (head node address, environment) ...",
        " ".join(
            [
                "srun",
                "--output",
                posixpath.join(log_dir, f"log-{spec.job_name}_%j_${{SLURM_RESTART_COUNT:-0}}.out"),
                "--chdir",
                posixpath.join(log_dir, "code"),
                "--wait=60",
                "--kill-on-bad-exit=1",
                *TOP_STEP_SRUN_ARGS,
                spec.command(),
            ]
        ),
    ]
    return "\n".join(lines) + "\n"
