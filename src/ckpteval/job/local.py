"""Run an invocation's job on this machine and follow it.

The job is the same bash script a Slurm allocation runs, started as a plain process in its own session
rather than through nemo-run's LocalExecutor: importing nemo_run costs ~12 s here, and the script
already does what an executor would (one process tree, logs, exit code) — so a plain process is
simpler and faster. Ctrl-C stops the job (and with it the deployment) and keeps finished tasks.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ckpteval.config.compile import CompiledConfig
from ckpteval.job.build import build_plan, local_toolchain
from ckpteval.job.files import job_files, write_job_files
from ckpteval.job.follow import follow
from ckpteval.job.invocation import InvocationRecord, now_iso, write_text_atomic
from ckpteval.job.plan import JobPlan
from ckpteval.results.model import InvocationResults

if TYPE_CHECKING:
    from ckpteval.config.schema import ExportSection


class LocalJobView:
    """Job files on this machine."""

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir

    def read_text(self, rel: str) -> str | None:
        try:
            return (self.job_dir / rel).read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError):
            return None


def local_job_dir(compiled: CompiledConfig, invocation: str) -> Path:
    """`<execution.output_dir>/<invocation>` as an absolute path (relative output dirs are per cwd)."""
    base = Path(compiled.config.execution.output_dir).expanduser()
    if not base.is_absolute():
        base = compiled.request.cwd / base
    return base.resolve() / invocation


@dataclass
class LocalLaunch:
    """An invocation that runs here."""

    compiled: CompiledConfig
    invocation: str

    def __post_init__(self) -> None:
        self.job_dir = local_job_dir(self.compiled, self.invocation)
        self.plan: JobPlan = build_plan(
            self.compiled,
            invocation=self.invocation,
            job_dir=str(self.job_dir),
            toolchain=local_toolchain(),
            launcher="local",
        )
        self.files = job_files(self.compiled, self.plan, launcher="local")

    def preview_panels(self, *, force_squash: bool = False, check: bool = False) -> list:
        """The job script (nothing to squash here)."""
        from ckpteval.config.preview import PreviewPanel

        return [
            PreviewPanel(
                title=f"job script {self.job_dir}/job.sh",
                body=self.files["job.sh"],
                language="bash",
                full_only_in_dry_run=True,
            )
        ]

    def record(self) -> InvocationRecord:
        return InvocationRecord(
            id=self.invocation,
            created=now_iso(),
            mode=self.compiled.mode,
            profile=self.compiled.profile.name,
            executor="local",
            job_dir=str(self.job_dir),
            tasks=[t.name for t in self.plan.tasks],
            command_line=["evaluate", *self.compiled.request.overrides],
            env_file=str(self.compiled.env_file) if self.compiled.env_file else None,
            extra={
                "task_dirs": {t.name: t.dir for t in self.plan.tasks},
                "task_repeats": {t.name: t.repeats for t in self.plan.tasks if t.repeats},
            },
        )

    def save(self, record: InvocationRecord) -> None:
        """Record, compiled config and provenance, written before the job starts."""
        record.save()
        for name in ("config.yaml", "job.yaml"):
            write_text_atomic(record.path / name, self.files[name])
        write_job_files(self.job_dir, self.files)

    def run(self, record: InvocationRecord) -> int:
        """Start the job, follow it, collect and print the results; the exit code is the job's."""
        self.save(record)
        return run_job_here(self.job_dir, record, export=self.compiled.config.export, **self._model_and_label())

    def run_quietly(self, record: InvocationRecord) -> tuple[int, InvocationResults]:
        """Start the job and wait for it without printing anything (for services such as the eval
        delegate); returns the job's exit code and its collected results (also written to results.json).
        Nothing is exported."""
        self.save(record)
        (self.job_dir / "logs").mkdir(exist_ok=True)
        with open(self.job_dir / "logs" / "job.log", "ab") as log:
            proc = _start_job(self.job_dir, log)
            try:
                returncode = proc.wait()
            except BaseException:
                _stop(proc)
                raise
        return returncode, self.collect(record)

    def collect(self, record: InvocationRecord) -> InvocationResults:
        """The job's results from its task dirs, written to `<job_dir>/results.json`."""
        return collect_here(self.job_dir, record, **self._model_and_label())

    def _model_and_label(self) -> dict[str, str | None]:
        """What results.json names: the checkpoint evaluated and the run's label."""
        deployment = self.compiled.config.deployment
        return {"model": getattr(deployment, "checkpoint_path", None), "label": self.compiled.config.run.name}


def collect_here(job_dir: Path, record: InvocationRecord, *, model: str | None, label: str | None) -> InvocationResults:
    """The results of the job in `job_dir` from its task dirs (the record's), written to its results.json."""
    from ckpteval.results.collect import collect_results
    from ckpteval.results.store import write_results

    tasks = list((record.extra.get("task_dirs") or {}).items())
    results = collect_results(job_dir, tasks, invocation=record.id, created=record.created, model=model, label=label)
    write_results(job_dir, results)
    return results


def run_job_here(
    job_dir: Path, record: InvocationRecord, *, model: str | None, label: str | None, export: ExportSection
) -> int:
    """Run the job script in `job_dir` as a process group, follow it, then collect, print and export the
    results. Ctrl-C stops the job (its trap stops the deployment); finished tasks keep their results."""
    from ckpteval.results.table import print_table
    from ckpteval.tasks.progress import progress_reader

    (job_dir / "logs").mkdir(exist_ok=True)
    log = open(job_dir / "logs" / "job.log", "ab")  # noqa: SIM115 (closed below, after the job)
    proc = _start_job(job_dir, log)
    from ckpteval.job.manage import process_start_time

    record.extra["pid"] = proc.pid
    record.extra["pid_start"] = process_start_time(proc.pid)
    record.save()
    task_dirs: dict[str, str] = record.extra.get("task_dirs") or {}
    tasks = list(task_dirs.items())
    interrupted = False
    try:
        follow(LocalJobView(job_dir), tasks, is_running=lambda: proc.poll() is None, progress=progress_reader)
    except KeyboardInterrupt:
        interrupted = True
        _stop(proc)
    finally:
        log.close()
    results = collect_here(job_dir, record, model=model, label=label)
    print_table([results])
    _export(results, job_dir, export, task_dirs)
    if proc.returncode == 3:
        _print_log_tail(job_dir / "logs" / "job.log")
    if interrupted:
        from rich.console import Console

        Console(stderr=True, highlight=False).print(
            f"stopped; finished tasks are kept. Go on where it stopped: [bold]evaluate resume {record.id}[/]"
        )
        return 130
    return 0 if proc.returncode == 0 else 1


def _export(results: InvocationResults, job_dir: Path, export: ExportSection, task_dirs: dict[str, str]) -> None:
    """Export the results where the config says (W&B, MLflow); a failed export never fails the run."""
    from ckpteval.export.invocation import enabled_destinations, export_invocation

    if enabled_destinations(export):
        export_invocation(results, job_dir, export, task_dirs=task_dirs)


def resume_here(record: InvocationRecord) -> int:
    """Run a stopped local invocation's job again in its job directory and follow it.

    Tasks marked done are skipped; the interrupted task's harness replays its cached responses, so only
    the requests it had not answered reach the model. Refused while the job still runs.
    """
    from ckpteval.errors import ConfigError
    from ckpteval.export.content import read_saved_config
    from ckpteval.export.invocation import export_section
    from ckpteval.job.manage import job_process_alive

    job_dir = Path(record.job_dir)
    if job_process_alive(record):
        raise ConfigError(
            f"Invocation {record.id} is still running (process group {record.extra['pid']}).",
            hint=f"Wait for it, or `evaluate cancel {record.id}` first.",
        )
    if not (job_dir / "job.sh").is_file():
        raise ConfigError(
            f"The job directory of invocation {record.id} is gone: {job_dir}.",
            hint="Run the `evaluate` command again to start over.",
        )
    config = read_saved_config(job_dir / "config.yaml")
    deployment = config.get("deployment") or {}
    return run_job_here(
        job_dir,
        record,
        model=deployment.get("checkpoint_path"),
        label=(config.get("run") or {}).get("name"),
        export=export_section(config, where=str(job_dir / "config.yaml")),
    )


def _start_job(job_dir: Path, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """`bash job.sh` in `job_dir`, in its own session (so it can be stopped as a whole), output to `log`."""
    return subprocess.Popen(
        ["bash", str(job_dir / "job.sh")],
        cwd=job_dir,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the job's process group (its trap stops the deployment); SIGKILL if it lingers."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=90)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _print_log_tail(path: Path, lines: int = 40) -> None:
    from rich.console import Console
    from rich.text import Text

    text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
    console = Console(stderr=True, highlight=False)
    console.print("[red]the job failed; last lines of its log:[/]")
    console.print(Text("\n".join(text)))
