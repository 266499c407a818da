"""One deployment kept across a watch run's checkpoints, each new one loaded into it in place.

A fresh deployment per checkpoint pays the server's start (process, megatron's import, the model build and
load) every time. Where the deployment can load another checkpoint of the same model in place (the builtin
server: `ckpteval.server.inplace`), the watcher starts it once, on the first checkpoint it evaluates, in the
run's state directory (its *load directory*: port, load secret, log), and each evaluation is the usual
invocation with `deployment.load_into=<that directory>`: its job has the kept server load its checkpoint under
its own identity instead of starting a server (`server.inplace_client.stand_in`), checks health and identity
as always, and records what the server reports it loaded. Each checkpoint stays its own invocation, with its
own results and provenance.

Before each evaluation the kept server is asked whether the checkpoint fits (same architecture, tokenizer and
saved layout); one that does not is evaluated with a fresh deployment of its own, as without keeping, and the
kept server is stopped (the next checkpoint starts a new one). Where nothing can be kept (`keep_decision`: a
deployment that cannot load in place, evaluations side by side, a cluster whose executor keeps no job; on
Slurm the kept deployment is a kept job: `execution.slurm_kept`), every checkpoint gets a
fresh deployment, as before, and the dry run and the terminal say why.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import contextlib
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ckpteval.errors import DeploymentError
from ckpteval.execution.backend import Placement
from ckpteval.watch.state import WatchSpec, watch_dir

LOAD_DIR = "deployment"  # under the run's state directory
PID_FILE = "server.pid"
START_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class KeepDecision:
    """Whether the run's evaluations share one deployment (`keep`), and in words what they do."""

    keep: bool
    why: str

    @property
    def line(self) -> str:
        """What the dry run and the watcher's start say."""
        if self.keep:
            return "one deployment kept across checkpoints, each loaded into it in place (" + self.why + ")"
        return "a fresh deployment per checkpoint: " + self.why


BUILTIN_KIND = "megatron/builtin"  # the server a kept cluster job runs (`execution.slurm_kept`)


def keep_decision(spec: WatchSpec, config: Any, *, here: bool, in_kept_job: bool = False) -> KeepDecision:
    """Whether `spec`'s evaluations (compiled `config`) can keep one deployment; `here`: they run on this
    machine; `in_kept_job`: on a cluster whose executor keeps one job for them (Slurm: `execution.slurm_kept`)."""
    from ckpteval.deploy.backends import backend_for

    deployment = config.deployment
    backend = backend_for(deployment)
    if spec.fresh_deployments:
        return KeepDecision(False, "--fresh-deployments")
    if not backend.loads_in_place:
        return KeepDecision(False, f"the {backend.kind} deployment cannot load another checkpoint in place")
    if (getattr(deployment, "num_replicas", None) or 1) > 1:
        return KeepDecision(False, "the builtin server with several replicas cannot load in place")
    if not here and not in_kept_job:
        return KeepDecision(False, "each evaluation on the cluster is its own job (one allocation per checkpoint)")
    if in_kept_job and _deployments_beside(config):
        return KeepDecision(False, _deployments_beside(config))
    if in_kept_job and not here and backend.kind != BUILTIN_KIND:
        return KeepDecision(
            False, f"a kept Slurm job holds the builtin server only, not {backend.kind}: one per checkpoint"
        )
    if spec.max_pending > 1:
        return KeepDecision(False, f"--max-pending {spec.max_pending}: evaluations side by side need one each")
    if in_kept_job and not here:
        return KeepDecision(True, f"the {backend.kind} server in one kept Slurm job, each checkpoint a step of it")
    return KeepDecision(True, f"the {backend.kind} server")


def _deployments_beside(config: Any) -> str:
    """Why a kept Slurm job cannot hold the evaluation's deployments ("" when it can: one server, one node)."""
    from ckpteval.job.roles import deployed_roles

    if len(deployed_roles(config)) > 1:
        return "a judge deployed beside the model: one Slurm job per checkpoint"
    if int(getattr(config.deployment, "num_nodes", 1) or 1) > 1:
        return "a deployment over several nodes: one Slurm job per checkpoint"
    return ""


class KeptJob(Protocol):
    """A kept deployment that lives in a job of the cluster (the executor's backend's `kept_job`: on Slurm,
    `execution.slurm_kept.KeptSlurmJob`), as the watcher uses it."""

    def place(self, iteration: int, iter_dir: str) -> Placement: ...

    def stop(self) -> None: ...

    def stop_leftover(self) -> None: ...


class KeptDeployment:
    """The run's kept server (see the module docstring): started on first use, stopped by `stop()`."""

    def __init__(self, run: str, compile_first: Any) -> None:
        self.run = run
        self.directory = watch_dir() / run / LOAD_DIR
        self.compile_first = compile_first  # (iteration, iter_dir) -> CompiledConfig, for the server's options
        self.process: subprocess.Popen[bytes] | None = None

    def place(self, iteration: int, iter_dir: str) -> Placement:
        """Where to serve `iter_dir`: the kept server when it fits (started now if none runs), else a fresh
        deployment (and the kept server stopped)."""
        from ckpteval.server.inplace_client import load_in_place

        note = ""
        if not self.running():
            note = self.start(iteration, iter_dir)
        try:
            answer = load_in_place(self.directory, iter_dir, check=True, timeout=600)
        except DeploymentError as exc:
            self.stop()
            return Placement(
                None,
                f"iteration {iteration}: the kept deployment did not answer ({exc.message}); a fresh deployment for it",
            )
        if answer.status == 409 and answer.refused:
            self.stop()
            return Placement(
                None,
                f"iteration {iteration}: {'; '.join(answer.refused)} than the kept deployment: "
                "a fresh deployment for it",
            )
        return Placement(str(self.directory), note)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, iteration: int, iter_dir: str) -> str:
        """Start the kept server on `iter_dir` with the evaluation's deployment options and wait until it serves;
        DeploymentError (with its log's tail) if it does not."""
        from ckpteval.server.inplace_client import PORT_FILE, server_url
        from ckpteval.server.launch import wait_until_healthy

        self.stop_leftover()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        (self.directory / PORT_FILE).unlink(missing_ok=True)
        argv = self._command(iteration, iter_dir)
        log_path = self.directory / "server.log"
        started = time.monotonic()
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=_offline_env()
            )
        from ckpteval.execution.processes import process_start_time

        (self.directory / PID_FILE).write_text(f"{self.process.pid} {process_start_time(self.process.pid)}\n")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (self.directory / PORT_FILE).is_file():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise DeploymentError(f"The kept deployment did not start; its log: {log_path}")
            time.sleep(0.1)
        try:
            wait_until_healthy(
                server_url(self.directory), timeout=START_TIMEOUT_S, process=self.process, log_path=log_path
            )
        except DeploymentError:
            self.stop()
            raise
        return (
            f"iteration {iteration}: started the kept deployment ({time.monotonic() - started:.0f} s; "
            f"pid {self.process.pid}, log {log_path})"
        )

    def _command(self, iteration: int, iter_dir: str) -> list[str]:
        """The evaluation's own builtin command line, made the kept server's: its port and load secret in the
        load directory, no identity of an invocation, no tokenizer to publish (each job publishes its own)."""
        from ckpteval.deploy.commands import builtin_command
        from ckpteval.server.inplace_client import load_dir_options
        from ckpteval.server.options import ServeOptions

        deployment = self.compile_first(iteration, iter_dir).config.deployment
        line = builtin_command(deployment, python=sys.executable, port=0)
        argv = shlex.split(line.removeprefix("exec "))
        options = ServeOptions.from_argv(argv[argv.index("serve") + 1 :])
        loadable = load_dir_options(self.directory)
        options = dataclasses.replace(
            options,
            checkpoint=Path(iter_dir),
            port=0,
            identity=f"{self.run}-kept",
            publish_tokenizer=None,
            load_into=None,
            report_file=self.directory / "served_checkpoint.json",
            port_file=loadable["port_file"],
            load_secret_file=loadable["load_secret_file"],
        )
        return options.to_argv(sys.executable)

    def stop(self) -> None:
        """Stop the kept server (SIGTERM, then SIGKILL after 30 s)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        (self.directory / PID_FILE).unlink(missing_ok=True)

    def stop_leftover(self) -> None:
        """Stop a kept server an earlier watcher left running (killed, or stopped while an evaluation used it),
        found by its pid and that process's start time."""
        from ckpteval.execution.processes import process_start_time

        try:
            pid_text, _, start = (self.directory / PID_FILE).read_text().strip().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            return
        if process_start_time(pid) == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
            for _ in range(300):
                if process_start_time(pid) != start:
                    break
                time.sleep(0.1)
        (self.directory / PID_FILE).unlink(missing_ok=True)


def _offline_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
