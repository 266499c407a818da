"""The watcher's one seam to the evaluation pipeline: evaluate this checkpoint, and how is it doing.

"Evaluate iteration N of this save dir with these configs/overrides on this profile" becomes the usual
`evaluate` invocation (one deployment, every task) with the checkpoint pinned to the iteration's own
directory (`run.model=<save_dir>/iter_NNNNNNN`, which the builtin server and Export-Deploy both read),
the tokenizer beside the save dir, and the per-invocation export off (the watcher exports curves).

It runs detached wherever the profile runs: on Slurm the job is submitted (`--batch`) and this returns;
here the job script starts in its own session and this returns, so the watcher keeps polling and a
watcher that is killed leaves its running evaluation alone. Built on the job backends of
`ckpteval.execution` (prepare, submit, status, results, cancel), as `ckpteval.run` is.
"""

from __future__ import annotations

import posixpath
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.api import compile_config  # resolves W&B model artifacts too
from ckpteval.config.compile import CompiledConfig
from ckpteval.config.compose import CompileRequest
from ckpteval.deploy.layout import TOKENIZER_DIR
from ckpteval.errors import ConfigError
from ckpteval.invocation.record import WatchOrigin, load_record, new_invocation_id
from ckpteval.results.model import InvocationResults
from ckpteval.watch.state import WatchSpec

FINAL_STATES = ("succeeded", "failed", "cancelled")
_children: dict[str, subprocess.Popen[bytes]] = {}  # local jobs this process started (reaped when they end)


@dataclass(frozen=True)
class EvaluationState:
    """Where one submitted evaluation stands; `results` once it has ended."""

    invocation: str
    state: str  # pending | running | succeeded | failed | cancelled | unknown
    results: InvocationResults | None = None
    detail: str = ""

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES


def checkpoint_overrides(spec: WatchSpec, iteration: int, iter_dir: str, *, run: str) -> tuple[str, ...]:
    """The overrides that make the usual invocation evaluate exactly this iteration (the user's come after)."""
    return (
        f"run.model={iter_dir}",
        f"deployment.tokenizer={posixpath.join(spec.save_dir, TOKENIZER_DIR)}",
        "deployment.prepare=null",  # a training checkpoint is never a packaged model to build
        f"run.name={run}-iter{iteration}",
        *spec.overrides,
        # the watcher exports one run with a point per iteration, not a run per invocation
        "export.wandb.enabled=false",
        "export.mlflow.enabled=false",
    )


def compile_evaluation(spec: WatchSpec, iteration: int, iter_dir: str, *, run: str) -> CompiledConfig:
    """The compiled config of the evaluation of one iteration; ConfigError on bad input."""
    request = CompileRequest(
        configs=tuple(spec.configs),
        profile=spec.profile,
        mode="local",
        overrides=checkpoint_overrides(spec, iteration, iter_dir, run=run),
        tasks=tuple(spec.tasks),
        env_file=Path(spec.env_file) if spec.env_file else None,
    )
    compiled = compile_config(request)
    if compiled.execution_type != "local":  # a cluster: submit and return (the watcher follows by status)
        import dataclasses

        compiled = compile_config(dataclasses.replace(request, mode="batch"))
    if compiled.config.deployment.type != "megatron":
        raise ConfigError(
            f"evaluate watch serves each Megatron checkpoint; the config's deployment is "
            f"{compiled.config.deployment.type!r}.",
            hint="Use a megatron deployment (the default), e.g. drop deployment=... from the overrides.",
        )
    return compiled


def _prepare(compiled: CompiledConfig, invocation: str) -> Any:
    from ckpteval.api import backend_for

    return backend_for(compiled.execution_type).prepare(compiled, invocation)


def preview(spec: WatchSpec, iteration: int, iter_dir: str, *, run: str) -> tuple[CompiledConfig, str, list[Any]]:
    """What `--dry-run` shows for one iteration: the compiled config, an invocation id, the job's panels."""
    compiled = compile_evaluation(spec, iteration, iter_dir, run=run)
    invocation = new_invocation_id()
    return compiled, invocation, _prepare(compiled, invocation).preview()


def submit(spec: WatchSpec, iteration: int, iter_dir: str, *, run: str) -> str:
    """Submit the evaluation of one iteration, detached; returns its invocation id (recorded as usual, with
    the watch run and iteration it evaluates)."""
    from ckpteval.execution.events import silent
    from ckpteval.execution.local import LocalJob

    compiled = compile_evaluation(spec, iteration, iter_dir, run=run)
    invocation = new_invocation_id()
    # here: the job script starts in its own session and runs on when this returns (or the watcher dies);
    # on Slurm (mode batch): squash, upload, submit, return
    job = _prepare(compiled, invocation).submit(silent)
    try:
        job.record.watch = WatchOrigin(run=run, iteration=iteration, iter_dir=iter_dir)
        job.record.save()
        if isinstance(job, LocalJob):
            _children[invocation] = job.proc
    finally:
        job.close()
    return invocation


def evaluation_state(invocation: str) -> EvaluationState:
    """The evaluation's state now, with its results (written to results.json here) once it has ended."""
    from ckpteval.api import backend_for

    child = _children.get(invocation)
    if child is not None and child.poll() is not None:
        del _children[invocation]  # reaped: its exit code is in the job dir
    record = load_record(invocation)
    backend = backend_for(record.executor)
    status = backend.status(record)
    if status.state not in FINAL_STATES:
        return EvaluationState(invocation, status.state, detail=status.detail)
    results = backend.results(record)  # nobody followed the job: collected (and results.json written) now
    return EvaluationState(invocation, status.state, results=results, detail=status.detail or status.log_tail[-300:])


def export_settings(spec: WatchSpec, *, run: str) -> Any:
    """The `export` section the user's configs and overrides give (W&B/MLflow destinations of the curves)."""
    # the save dir may not exist yet (the training has not started): its nearest existing parent stands in
    # for the checkpoint in this config check, which runs no evaluation
    stand_in = Path(spec.save_dir)
    while not stand_in.exists() and stand_in.parent != stand_in:
        stand_in = stand_in.parent
    request = CompileRequest(
        configs=tuple(spec.configs),
        profile=spec.profile,
        mode="local",
        overrides=(f"run.model={stand_in}", "deployment.prepare=null", f"run.name={run}", *spec.overrides),
        tasks=tuple(spec.tasks),
        env_file=Path(spec.env_file) if spec.env_file else None,
    )
    return compile_config(request).config.export


def cancel(invocation: str) -> str:
    """Stop a submitted evaluation."""
    from ckpteval.api import cancel as cancel_invocation

    return cancel_invocation(invocation)
