"""The watcher's one seam to the evaluation pipeline: evaluate this checkpoint, and how is it doing.

"Evaluate iteration N of this save dir with these configs/overrides on this profile" becomes the usual
`evaluate` invocation (one deployment, every task) with the checkpoint pinned to the iteration's own
directory (`run.model=<save_dir>/iter_NNNNNNN`, which the builtin server and Export-Deploy both read),
the tokenizer beside the save dir, and the per-invocation export off (the watcher exports curves).

It runs detached wherever the profile runs: on Slurm the job is submitted (`--batch`) and this returns;
here the job script starts in its own session and this returns, so the watcher keeps polling and a
watcher that is killed leaves its running evaluation alone. Built today on `ckpteval.invoke.make_launch`
and `ckpteval.job.manage` (status, results); the only module to change when `ckpteval.run` replaces them.
"""

from __future__ import annotations

import posixpath
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.config.compile import CompiledConfig, compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.deploy.layout import TOKENIZER_DIR
from ckpteval.errors import ConfigError
from ckpteval.job.invocation import InvocationRecord, load_record, new_invocation_id
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


def preview(spec: WatchSpec, iteration: int, iter_dir: str, *, run: str) -> tuple[CompiledConfig, str, list[Any]]:
    """What `--dry-run` shows for one iteration: the compiled config, an invocation id, the job's panels."""
    from ckpteval.invoke import make_launch

    compiled = compile_evaluation(spec, iteration, iter_dir, run=run)
    invocation = new_invocation_id()
    launch = make_launch(compiled, invocation)
    return compiled, invocation, launch.preview_panels()


def submit(spec: WatchSpec, iteration: int, iter_dir: str, *, run: str) -> str:
    """Submit the evaluation of one iteration, detached; returns its invocation id (recorded as usual)."""
    from ckpteval.invoke import make_launch

    compiled = compile_evaluation(spec, iteration, iter_dir, run=run)
    invocation = new_invocation_id()
    launch = make_launch(compiled, invocation)
    record = launch.record()
    record.extra["watch"] = {"run": run, "iteration": iteration, "iter_dir": iter_dir}
    if compiled.execution_type == "local":
        _start_local(launch, record)
    else:
        launch.run(record)  # mode batch: squash, upload, submit, return
    return invocation


def _start_local(launch: Any, record: InvocationRecord) -> None:
    from ckpteval.job.manage import process_start_time

    launch.save(record)
    job_dir = Path(launch.job_dir)
    (job_dir / "logs").mkdir(exist_ok=True)
    with open(job_dir / "logs" / "job.log", "ab") as log:
        proc = subprocess.Popen(
            ["bash", str(job_dir / "job.sh")],
            cwd=job_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # not stopped with the watcher: a restarted watcher finds it running
        )
    _children[record.id] = proc
    record.extra["pid"] = proc.pid
    record.extra["pid_start"] = process_start_time(proc.pid)
    record.save()


def evaluation_state(invocation: str) -> EvaluationState:
    """The evaluation's state now, with its results (written to results.json here) once it has ended."""
    from ckpteval.job import manage

    child = _children.get(invocation)
    if child is not None and child.poll() is not None:
        del _children[invocation]  # reaped: its exit code is in the job dir
    record = load_record(invocation)
    status = manage.status(record)
    if status.state not in FINAL_STATES:
        return EvaluationState(invocation, status.state, detail=status.detail)
    if record.executor == "local":
        from ckpteval.job.local import collect_here

        results = collect_here(Path(record.job_dir), record, model=_model(record), label=None)
    else:
        results = manage.results(record)
    return EvaluationState(invocation, status.state, results=results, detail=status.detail or status.log_tail[-300:])


def _model(record: InvocationRecord) -> str | None:
    watch = record.extra.get("watch") or {}
    return record.extra.get("model") or (str(watch.get("iter_dir")) if watch.get("iter_dir") else None)


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
    from ckpteval.job import manage

    return manage.cancel(load_record(invocation))
