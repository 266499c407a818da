"""One invocation, end to end — the numbered steps of DESIGN.md's data path.

Read this file to know what `evaluate` does: compile, plan, preview (a dry run stops there), record,
then launch — here as a local process, or on Slurm through nemo-run (squashing images first) — follow,
collect results, export.
"""

from __future__ import annotations

from typing import Any

from ckpteval.config.compile import CompiledConfig, compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.errors import ConfigError
from ckpteval.job.invocation import new_invocation_id


def make_launch(compiled: CompiledConfig, invocation: str, *, force_squash: bool = False) -> Any:
    """The launch for where the config runs: this machine, or a Slurm cluster (images squashed first)."""
    if compiled.execution_type == "local":
        from ckpteval.job.local import LocalLaunch

        if compiled.mode == "batch":
            # a local job is a child of this process (Ctrl-C stops it): there is no detached local run
            raise ConfigError(
                f"--batch submits to a cluster and returns; profile [{compiled.profile.name}] runs on this machine.",
                hint=f"Use --run {compiled.profile.name} (or neither flag) to run here, attached; "
                "or --batch with a Slurm profile.",
            )

        return LocalLaunch(compiled, invocation)
    from ckpteval.cluster.launch import SlurmLaunch

    return SlurmLaunch(compiled, invocation, force_squash=force_squash)


def run_invocation(
    request: CompileRequest, *, dry_run: bool = False, force_squash: bool = False, check_squash: bool = False
) -> int:
    """Run one `evaluate` invocation; returns the process exit code (0: every task succeeded)."""
    # 1-4. compile: compose configs + profile + overrides, filter tasks, resolve, type, validate
    compiled = compile_config(request)
    # plan the one job of this invocation (deployment once, every task against it)
    invocation = new_invocation_id()
    launch = make_launch(compiled, invocation, force_squash=force_squash)
    # 5. preview: compiled config, job script, squash plan — all that --dry-run shows
    from ckpteval.config.preview import render_preview

    panels = launch.preview_panels(force_squash=force_squash, check=check_squash)
    render_preview(compiled, invocation=invocation, panels=panels, dry_run=dry_run)
    if dry_run:
        return 0
    # record the invocation (config + provenance) before anything is submitted, then 6-11
    record = launch.record()
    return int(launch.run(record))
