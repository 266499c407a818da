"""The calls a Python user makes — and the ones the `evaluate` CLI and the delegate service make.

`run` is one invocation end to end, in the order of the data path (docs/architecture.md): compile (profile, compose,
validate), plan the one job, preview (a dry run stops there), then through the job backend of where
the config runs: submit, follow, collect, export. Nothing here prints or asks: progress goes to the
`reporter` as events (`ckpteval.execution.events`), and the outcome is returned.

    import ckpteval
    outcome = ckpteval.run(configs=["tiny"], tasks=["hellaswag"])
    outcome.scores            # {"adlr_mmlu": {"acc": 0.4, ...}, ...}
    ckpteval.status(outcome.invocation).state
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ckpteval.config.compile import CompiledConfig
from ckpteval.config.compile import compile_config as _compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.errors import CkptevalError, ConfigError, ExportError
from ckpteval.execution.backend import InvocationStatus, Job
from ckpteval.execution.backends import backend_for
from ckpteval.execution.events import Preview, Reporter, ResultsReady, Submitted, silent
from ckpteval.invocation.jobdir import JobDir
from ckpteval.invocation.record import InvocationRecord, list_records, load_record, new_invocation_id, records_dir
from ckpteval.results.model import InvocationResults

if TYPE_CHECKING:
    from ckpteval.checkpoint.description import CheckpointDescription
    from ckpteval.config.schema import ExportSection
    from ckpteval.export.artifacts import ResolvedArtifact
    from ckpteval.export.outcome import Destination, ExportOutcome
    from ckpteval.results.compare import InvocationSamples

OutcomeState = Literal["dry-run", "submitted", "succeeded", "failed", "cancelled", "interrupted"]
INTERRUPTED_EXIT = 130


@dataclass(frozen=True)
class Outcome:
    """What an invocation came to.

    `exit_status` is the CLI's exit code: 0 (every task succeeded; or submitted, or a dry run), 1 (failed),
    130 (interrupted). `still_running`: interrupted while following a job that goes on running (on Slurm);
    `ckpteval.cancel(outcome.invocation)` stops it.
    """

    invocation: str
    state: OutcomeState
    exit_status: int
    record: InvocationRecord | None = None
    results: InvocationResults | None = None
    message: str = ""  # for a failed job: what ended it ("the job ended failed; last lines of its log:")
    log_tail: str = ""
    still_running: bool = False
    exports: tuple[ExportOutcome, ...] = ()

    @property
    def scores(self) -> dict[str, dict[str, float]]:
        """task -> metric -> value, of the tasks that produced scores."""
        if self.results is None:
            return {}
        return {name: {m: v.value for m, v in o.metrics.items()} for name, o in self.results.tasks.items()}


def _compile(request: CompileRequest) -> CompiledConfig:
    return _compile_config(request, resolve_artifact=_resolve_artifact)


def _resolve_artifact(value: str, *, wandb_settings: object = None) -> ResolvedArtifact:
    """`run.model` naming a W&B model artifact, resolved to its checkpoint path (wandb loads only here)."""
    from ckpteval.export.artifacts import resolve_model_artifact

    return resolve_model_artifact(value, wandb_settings=wandb_settings)


def make_request(
    configs: Sequence[str] = (),
    *,
    profile: str | None = None,
    mode: Literal["local", "run", "batch"] | None = None,
    overrides: Sequence[str] = (),
    tasks: Sequence[str] = (),
    env_file: str | Path | None = None,
    cwd: str | Path | None = None,
) -> CompileRequest:
    """A compile request from plain arguments (`mode` defaults to attached: `local` without a profile, else `run`)."""
    return CompileRequest(
        configs=tuple(configs),
        profile=profile,
        mode=mode or ("run" if profile else "local"),
        overrides=tuple(overrides),
        tasks=tuple(tasks),
        env_file=Path(env_file) if env_file else None,
        cwd=Path(cwd) if cwd else Path.cwd(),
    )


def compile_config(request: CompileRequest | None = None, **arguments: object) -> CompiledConfig:
    """Compose, type and validate a config (a `CompileRequest`, or `make_request`'s arguments)."""
    return _compile(request or make_request(**arguments))  # type: ignore[arg-type]


def run(
    request: CompileRequest | None = None,
    *,
    configs: Sequence[str] = (),
    profile: str | None = None,
    mode: Literal["local", "run", "batch"] | None = None,
    overrides: Sequence[str] = (),
    tasks: Sequence[str] = (),
    env_file: str | Path | None = None,
    reporter: Reporter | None = None,
    dry_run: bool = False,
    force_squash: bool = False,
    check_squash: bool = False,
    export: bool = True,
) -> Outcome:
    """Run one invocation: compile, preview, submit, follow (unless `mode="batch"`), collect, export.

    `request` or the plain arguments say what to compile (see `make_request`). `export=False` skips the
    export this process would do (a job on Slurm exports itself). Errors are `ckpteval.errors` exceptions.
    """
    report = reporter or silent
    request = request or make_request(
        configs, profile=profile, mode=mode, overrides=overrides, tasks=tasks, env_file=env_file
    )
    # 1-4. compile: compose configs + profile + overrides, filter tasks, resolve, type, validate
    compiled = _compile(request)
    invocation = new_invocation_id()
    # plan the one job of this invocation (deployment once, every task against it) where it runs
    from ckpteval.execution.pipeline import plan_job

    planned = plan_job(compiled, invocation, force_squash=force_squash)
    # 4b. the checkpoint, read (on a cluster only with check_squash; a real run reads it before submitting):
    # a backend that cannot serve it is refused here, before any side effect
    checkpoint = planned.check_checkpoint(check=check_squash)
    # 5. preview: compiled config, checkpoint, job script, squash plan — all that --dry-run shows
    report(Preview(compiled, invocation, [*checkpoint, *planned.preview(check=check_squash)], dry_run))
    if dry_run:
        return Outcome(invocation, "dry-run", 0)
    # 6-7. stage (images, data, secrets), write the job's files, record the invocation, start it
    job = planned.submit(report)
    try:
        if compiled.mode == "batch":
            report(Submitted(job.record))
            return Outcome(invocation, "submitted", 0, record=job.record)
        # 8-11. the job deploys, evaluates and writes its results; here: follow, collect, export
        return _follow_to_end(job, report, (lambda: compiled.config.export) if export else None)
    finally:
        job.close()


def submit(
    request: CompileRequest | CompiledConfig,
    *,
    reporter: Reporter | None = None,
    force_squash: bool = False,
    invocation: str | None = None,
) -> Outcome:
    """Submit an invocation's job and return without following it, wherever it runs: on a cluster it is
    queued; on this machine it runs on in its own session (a caller that ends leaves it running). Follow it
    with `status`, read it with `results`, stop it with `cancel` (what `evaluate watch` does).

    `invocation`: the id to give it (from `new_invocation_id`), for a caller that records it before
    submitting, so that after a crash it can tell whether the submission was made (its record exists)."""
    report = reporter or silent
    compiled = request if isinstance(request, CompiledConfig) else _compile(request)
    if invocation is not None and (records_dir() / invocation).exists():
        raise ConfigError(f"Invocation {invocation} is already recorded; submit it under a new id.")
    invocation = invocation or new_invocation_id()
    from ckpteval.execution.pipeline import plan_job

    planned = plan_job(compiled, invocation, force_squash=force_squash)
    planned.check_checkpoint()
    job = planned.submit(report)
    try:
        report(Submitted(job.record))
        return Outcome(invocation, "submitted", 0, record=job.record)
    finally:
        job.close()  # a job here is not waited for: Python reaps it at a later subprocess call


def _follow_to_end(job: Job, report: Reporter, export: Callable[[], ExportSection] | None) -> Outcome:
    record = job.record
    interrupted = False
    try:
        job.follow(report)
    except KeyboardInterrupt:
        interrupted = True
        if not job.interrupt():
            return Outcome(record.id, "interrupted", INTERRUPTED_EXIT, record=record, still_running=True)
    results = job.collect()
    end = job.end(results)
    report(ResultsReady(results))
    exports: list[ExportOutcome] = []
    if export is not None and job.exports_here:
        exports = _export(record, results, export(), report)
    if interrupted:
        return Outcome(
            record.id, "interrupted", INTERRUPTED_EXIT, record=record, results=results, exports=tuple(exports)
        )
    return Outcome(
        record.id,
        end.state if end.state in ("succeeded", "failed", "cancelled") else "failed",
        0 if end.state == "succeeded" else 1,
        record=record,
        results=results,
        message=end.message,
        log_tail=end.log_tail,
        exports=tuple(exports),
    )


def _export(
    record: InvocationRecord, results: InvocationResults, export: ExportSection, report: Reporter
) -> list[ExportOutcome]:
    """Export where the config says (W&B, MLflow); a failed export never fails the run."""
    from ckpteval.export.invocation import enabled_destinations, export_invocation

    if not enabled_destinations(export):
        return []
    return export_invocation(
        results, JobDir(record.job_dir).path(), export, task_dirs=dict(record.task_dirs), report=report
    )


def _record(invocation: str | InvocationRecord) -> InvocationRecord:
    return invocation if isinstance(invocation, InvocationRecord) else load_record(invocation)


def attach(invocation: str | InvocationRecord) -> Job:
    """The job handle of a recorded invocation (an id, or an unambiguous prefix), from its executor's backend:
    its `status`, `cancel`, `read`, `logs` and `results`. Close it (or use it in a `with`) when done."""
    record = _record(invocation)
    return backend_for(record.executor).attach(record)


def status(invocation: str | InvocationRecord) -> InvocationStatus:
    """Where an invocation (an id, or an unambiguous prefix) stands now."""
    with attach(invocation) as job:
        return job.status()


def statuses(limit: int = 20) -> list[InvocationStatus]:
    """The recent invocations' statuses, newest first (one whose cluster cannot be reached: `unknown`)."""
    out = []
    for record in list_records()[:limit]:
        try:
            out.append(status(record))
        except CkptevalError as exc:
            out.append(InvocationStatus(record=record, state="unknown", snapshot=None, detail=exc.message))
    return out


def results(invocation: str | InvocationRecord) -> InvocationResults:
    """An invocation's results (fetched from its cluster if needed; partial while it runs)."""
    with attach(invocation) as job:
        return job.results()


def invocation_samples(invocation: str) -> InvocationSamples:
    """The results and per-sample scores of a recorded invocation (an id or a prefix). A Slurm
    invocation's files are fetched from the cluster first, as `ckpteval.results` does."""
    from ckpteval.results.compare import InvocationSamples

    record = load_record(invocation)
    found = results(record)  # a cluster invocation's files are fetched here, into local_results_dir
    job_dir = Path(record.local_results_dir or record.job_dir)
    return InvocationSamples.load(job_dir, found, dict(record.task_dirs))


def cancel(invocation: str | InvocationRecord) -> str:
    """Stop an invocation's job; returns what was done, in words."""
    with attach(invocation) as job:
        return job.cancel()


def logs(invocation: str | InvocationRecord, *, follow: bool = False, source: str = "job") -> Iterator[str]:
    """An invocation's log lines: the job's (`job`), the deployment's, a task's (its name), or `slurm`."""
    return _log_lines(attach(invocation), follow=follow, source=source)


def _log_lines(job: Job, *, follow: bool, source: str) -> Iterator[str]:
    with job:
        yield from job.logs(follow=follow, source=source)


def resume(invocation: str | InvocationRecord, *, follow: bool = False, reporter: Reporter | None = None) -> Outcome:
    """Run a stopped invocation's job again: finished tasks are skipped, cached responses replayed.

    On Slurm the job is resubmitted (followed like `run` with `follow`); on this machine it always runs
    attached. Refused while the job still runs.
    """
    report = reporter or silent
    record = _record(invocation)
    job = backend_for(record.executor).resume(record, report)
    try:
        if not follow and job.runs_detached:
            report(Submitted(record, resumed=True))
            return Outcome(record.id, "submitted", 0, record=record)
        return _follow_to_end(job, report, lambda: saved_export_section(record))
    finally:
        job.close()


def saved_export_section(record: InvocationRecord) -> ExportSection:
    """The `export` section of the config an invocation was run with (its saved config.yaml)."""
    from ckpteval.export.content import read_saved_config
    from ckpteval.export.invocation import export_section

    config_file = _config_file(record)
    return export_section(read_saved_config(config_file), where=str(config_file))


def _local_files(record: InvocationRecord) -> Path:
    """Where this machine holds the invocation's files: its job dir (local runs), the directory its
    results were fetched to (cluster runs), else its record directory."""
    if record.local_results_dir and Path(record.local_results_dir).is_dir():
        return Path(record.local_results_dir)
    return record.path


def _config_file(record: InvocationRecord) -> Path:
    beside = _local_files(record) / JobDir.CONFIG
    return beside if beside.is_file() else record.path / JobDir.CONFIG


def export(
    invocation: str | InvocationRecord,
    destinations: Sequence[Destination] | None = None,
    *,
    reporter: Reporter | None = None,
) -> list[ExportOutcome]:
    """Export a recorded invocation's results (again) to `destinations` (default: what its config enables).

    Raises ExportError when nothing is enabled or asked for.
    """
    from ckpteval.export.invocation import enabled_destinations, export_invocation

    record = _record(invocation)
    found = results(record)
    config_file = _config_file(record)
    section = saved_export_section(record)
    chosen = list(destinations) if destinations else enabled_destinations(section)
    if not chosen:
        raise ExportError(
            f"Invocation {record.id} has no export enabled in its config.",
            hint="Name a destination: evaluate export " + record.id + " --to wandb (or --to mlflow).",
        )
    return export_invocation(
        found,
        _local_files(record),
        section,
        destinations=chosen,
        config_file=config_file,
        task_dirs=dict(record.task_dirs),
        report=reporter or silent,
    )


def inspect_checkpoint(
    path: str | Path,
    *,
    profile: str | None = None,
    tokenizer: str | None = None,
    origin: str | None = None,
    env_file: str | Path | None = None,
) -> CheckpointDescription:
    """Describe a checkpoint before anything runs: layout, family, forward-changing settings, saved
    parallelism, dtype, size, tokenizer, and for each backend whether it can serve it (and the memory).

    With a `profile` the path is where its jobs run, read through its executor's backend (on a cluster or a
    machine reached over SSH: its small files in one round trip, no weights downloaded). `tokenizer` is what
    `deployment.tokenizer` would say, `origin` what `deployment.origin` would (the Hugging Face model it came
    from, compared with its args).
    """
    from ckpteval.checkpoint.description import describe_checkpoint

    if profile is None:
        return describe_checkpoint(path, tokenizer=tokenizer, origin=origin)
    from ckpteval.config.profiles import load_env_file
    from ckpteval.execution.backends import backend_for

    chosen = load_env_file(Path(env_file) if env_file else None).profile(profile)
    backend = backend_for(chosen.executor)
    return backend.describe_checkpoint(chosen, str(path), tokenizer=tokenizer, origin=origin)
