"""One invocation, end to end — the numbered steps of DESIGN.md's data path.

Read this file to know what `evaluate` does: compile, preview, (dry run stops here), record,
squash (Slurm over SSH), launch, follow, collect results, export.
"""

from __future__ import annotations

import sys

from ckpteval.config.compile import CompiledConfig, compile_config
from ckpteval.config.compose import CompileRequest


def run_invocation(request: CompileRequest, *, dry_run: bool = False, force_squash: bool = False) -> int:
    """Run one `evaluate` invocation; returns the process exit code (0: every task succeeded)."""
    # 1-4. compile: compose configs + profile + overrides, filter tasks, resolve, type, validate
    compiled = compile_config(request)
    # 5. preview (all of --dry-run)
    from ckpteval.config.preview import render_preview

    render_preview(compiled, dry_run=dry_run)
    if dry_run:
        return 0
    return _launch(compiled, force_squash=force_squash)


def _launch(compiled: CompiledConfig, *, force_squash: bool) -> int:
    sys.stderr.write("launching is not wired yet\n")
    return 3
