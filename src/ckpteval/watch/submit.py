"""The watcher's one seam to the evaluation pipeline: evaluate this checkpoint, and how is it doing.

"Evaluate iteration N of this save dir with these configs/overrides on this profile" becomes the usual
`evaluate` invocation (one deployment, every task) with the checkpoint pinned to the iteration's own
directory (`run.model=<save_dir>/iter_NNNNNNN`, which the builtin server and Export-Deploy both read),
the tokenizer beside the save dir, and the per-invocation export off (the watcher exports curves).

It runs detached wherever the profile runs (`ckpteval.submit`: on Slurm the job is queued; here the job
script starts in its own session), so the watcher keeps polling and a watcher that is killed leaves its
running evaluation alone. Only library calls are made (`ckpteval.submit`, `status`, `results`, `cancel`):
nothing here asks where the job runs.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.api import compile_config, make_request  # api's compile_config resolves W&B model artifacts too
from ckpteval.checkpoint.layout import TOKENIZER_DIR
from ckpteval.config.compile import CompiledConfig
from ckpteval.config.compose import CompileRequest
from ckpteval.config.schema import EXPORT_SECTIONS
from ckpteval.errors import ConfigError
from ckpteval.invocation.record import WatchOrigin, new_invocation_id
from ckpteval.results.model import InvocationResults
from ckpteval.watch.state import WatchSpec

FINAL_STATES = ("succeeded", "failed", "cancelled")


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


def checkpoint_overrides(
    spec: WatchSpec, iteration: int, iter_dir: str, *, run: str, load_into: str | None = None
) -> tuple[str, ...]:
    """The overrides that make the usual invocation evaluate exactly this iteration (the user's come after);
    `load_into`: the kept deployment's load directory (`watch.kept`), where the checkpoint is loaded in place."""
    return (
        f"run.model={iter_dir}",
        f"deployment.tokenizer={posixpath.join(spec.save_dir, TOKENIZER_DIR)}",
        *_no_packaged_model(spec),
        f"run.name={run}-iter{iteration}",
        *spec.overrides,
        # the watcher exports one run with a point per iteration, not a run per invocation
        *(f"export.{name}.enabled=false" for name in EXPORT_SECTIONS),
        *([f"deployment.load_into={load_into}"] if load_into else []),
    )


def _no_packaged_model(spec: WatchSpec) -> tuple[str, ...]:
    """`deployment.prepare=null`: a training checkpoint is never a packaged model to build; only megatron's
    deployment has the key (`deployment=sglang` or `vllm` among the user's overrides: an engine serving the
    checkpoint's export)."""
    groups = [o.split("=", 1)[1] for o in spec.overrides if o.startswith("deployment=")]
    return () if groups and groups[-1] != "megatron" else ("deployment.prepare=null",)


def evaluation_request(
    spec: WatchSpec, iteration: int, iter_dir: str, *, run: str, load_into: str | None = None
) -> CompileRequest:
    """The compile request of the evaluation of one iteration (the usual one for the spec's profile)."""
    return make_request(
        spec.configs,
        profile=spec.profile,
        overrides=checkpoint_overrides(spec, iteration, iter_dir, run=run, load_into=load_into),
        tasks=spec.tasks,
        env_file=spec.env_file,
    )


def compile_evaluation(
    spec: WatchSpec, iteration: int, iter_dir: str, *, run: str, load_into: str | None = None
) -> CompiledConfig:
    """The compiled config of the evaluation of one iteration; ConfigError on bad input."""
    from ckpteval.deploy.backends import backend_for

    compiled = compile_config(evaluation_request(spec, iteration, iter_dir, run=run, load_into=load_into))
    deployment = compiled.config.deployment
    # megatron serves the checkpoint; vLLM and SGLang serve its export, made by the job's first step
    if deployment.type != "megatron" and not backend_for(deployment).serves_hf_export:
        raise ConfigError(
            f"evaluate watch serves each Megatron checkpoint; the config's deployment is {deployment.type!r}.",
            hint="Use a megatron deployment (the default), or vllm / sglang (they serve its export).",
        )
    return compiled


def preview(
    spec: WatchSpec, iteration: int, iter_dir: str, *, run: str, load_into: str | None = None
) -> tuple[CompiledConfig, str, list[Any]]:
    """What `--dry-run` shows for one iteration: the compiled config, an invocation id, the job's panels."""
    from ckpteval.execution.pipeline import plan_job

    compiled = compile_evaluation(spec, iteration, iter_dir, run=run, load_into=load_into)
    invocation = new_invocation_id()
    return compiled, invocation, plan_job(compiled, invocation).preview()


def submit(
    spec: WatchSpec,
    iteration: int,
    iter_dir: str,
    *,
    run: str,
    invocation: str | None = None,
    load_into: str | None = None,
) -> str:
    """Submit the evaluation of one iteration, detached, through `ckpteval.submit`, as `invocation` (an id the
    watcher recorded first; a fresh one when None); returns its invocation id (recorded as usual, with the
    watch run and iteration it evaluates). `load_into`: served by the kept deployment (`watch.kept`)."""
    from ckpteval.api import submit as submit_invocation

    compiled = compile_evaluation(spec, iteration, iter_dir, run=run, load_into=load_into)
    outcome = submit_invocation(compiled, invocation=invocation)
    assert outcome.record is not None
    outcome.record.watch = WatchOrigin(run=run, iteration=iteration, iter_dir=iter_dir)
    outcome.record.save()
    return outcome.invocation


def adopt(invocation: str, *, run: str, iteration: int, iter_dir: str) -> bool:
    """Whether `invocation` was recorded (its submission got that far before the watcher was killed); if so
    it is tagged with the watch run and iteration, where the kill came before `submit` could do it."""
    from ckpteval.invocation.record import RECORD_FILE, load_record, records_dir

    if not (records_dir() / invocation / RECORD_FILE).is_file():
        return False
    record = load_record(invocation)
    if record.watch is None:
        record.watch = WatchOrigin(run=run, iteration=iteration, iter_dir=iter_dir)
        record.save()
    return True


def evaluation_state(invocation: str) -> EvaluationState:
    """The evaluation's state now (`ckpteval.status`), with its results (`ckpteval.results`, which writes
    results.json of a job nobody followed) once it has ended."""
    from ckpteval.api import results, status

    now = status(invocation)
    if now.state not in FINAL_STATES:
        return EvaluationState(invocation, now.state, detail=now.detail)
    return EvaluationState(invocation, now.state, results=results(now.record), detail=now.detail or now.log_tail[-300:])


LOCAL_EVAL_TIMEOUT = 4 * 3600.0  # seconds: a Slurm profile's default walltime


@dataclass(frozen=True)
class WatchSettings:
    """What the watcher takes from the user's configs: where the curves go, and how long an evaluation
    may take (from submission: a Slurm job's queueing plus its walltime; here 4 h) unless --eval-timeout."""

    export: Any  # the config's `export` section
    eval_timeout: float
    config: Any = None  # the whole compiled config (`watch.kept.keep_decision` reads its deployment)


def watch_settings(spec: WatchSpec, *, run: str) -> WatchSettings:
    """The settings of `spec`'s configs (compiling them once: bad input fails here)."""
    config = _check_config(spec, run=run)
    walltime = getattr(config.execution, "walltime", None)
    default = 2 * walltime_seconds(walltime) if walltime else LOCAL_EVAL_TIMEOUT
    return WatchSettings(export=config.export, eval_timeout=spec.eval_timeout or default, config=config)


def walltime_seconds(walltime: str) -> float:
    """Slurm's `[D-]HH:MM:SS` (or `MM:SS`, or minutes) in seconds."""
    days, _, clock = walltime.rpartition("-")
    parts = [float(p) for p in clock.split(":")]
    if len(parts) == 1:
        parts = [0.0, parts[0], 0.0]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    hours, minutes, seconds = parts
    return (float(days or 0) * 24 + hours) * 3600 + minutes * 60 + seconds


def export_settings(spec: WatchSpec, *, run: str) -> Any:
    """The `export` section the user's configs and overrides give (W&B/MLflow destinations of the curves)."""
    return _check_config(spec, run=run).export


def _check_config(spec: WatchSpec, *, run: str) -> Any:
    # the save dir may not exist yet (the training has not started): its nearest existing parent stands in
    # for the checkpoint in this config check, which runs no evaluation
    stand_in = Path(spec.save_dir)
    while not stand_in.exists() and stand_in.parent != stand_in:
        stand_in = stand_in.parent
    request = CompileRequest(
        configs=tuple(spec.configs),
        profile=spec.profile,
        mode="local",
        overrides=(f"run.model={stand_in}", *_no_packaged_model(spec), f"run.name={run}", *spec.overrides),
        tasks=tuple(spec.tasks),
        env_file=Path(spec.env_file) if spec.env_file else None,
    )
    return compile_config(request).config


def cancel(invocation: str) -> str:
    """Stop a submitted evaluation."""
    from ckpteval.api import cancel as cancel_invocation

    return cancel_invocation(invocation)
