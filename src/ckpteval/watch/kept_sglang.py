"""One SGLang server kept across a watch run's checkpoints, each new one's export loaded into it in place.

As `watch.kept` does for the builtin server, with SGLang's way of loading (`deploy.sglang_inplace`): SGLang serves
Hugging Face directories, so before each evaluation the watcher makes (or finds) the checkpoint's export in the
cache the jobs use (`python -m ckpteval.hfexport cached`, the job's own export step, which then finds it: 0
tensors written) and compares it with the export the server holds (config.json's architecture, the tokenizer's
files): one that fits is loaded by the evaluation's job (`deployment.load_into`), one that does not gets a fresh
deployment of its own, and the kept server is stopped. The server is started on the first checkpoint's export
with the run's own weight version (`<run>-kept`); each job's load replaces it with the invocation's identity.
A job whose load fails leaves the server's weight version as it was (nothing served under the job's identity)
and the server holding what SGLang rolled back to: the next checkpoint's load replaces every tensor again.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ckpteval.errors import DeploymentError
from ckpteval.watch.kept import PID_FILE, START_TIMEOUT_S, KeptDeployment, Placement, _offline_env

EXPORTS = "exports"  # under the load directory: one link per checkpoint evaluated, to its export in the cache


class KeptSglang(KeptDeployment):
    """The run's kept SGLang server (see the module docstring): started on first use, stopped by `stop()`."""

    def place(self, iteration: int, iter_dir: str) -> Placement:
        """Where to serve `iter_dir`: the kept server when its export fits (started now if none runs), else a fresh
        deployment (and the kept server stopped)."""
        from ckpteval.deploy.sglang_inplace import incompatibilities, model_info, server_url

        try:
            export = self.export(iteration, iter_dir)
        except DeploymentError as exc:
            self.stop()
            return Placement(None, f"iteration {iteration}: {exc.message}; a fresh deployment for it")
        if not self.running():
            return Placement(str(self.directory), self.start(iteration, iter_dir, export))
        try:
            held = Path(str(model_info(server_url(self.directory)).get("model_path") or ""))
        except DeploymentError as exc:
            self.stop()
            return Placement(
                None, f"iteration {iteration}: the kept SGLang did not answer ({exc.message}); a fresh deployment"
            )
        reasons = incompatibilities(held, export)
        if reasons:
            self.stop()
            return Placement(
                None, f"iteration {iteration}: {'; '.join(reasons)} than the kept deployment: a fresh deployment for it"
            )
        return Placement(str(self.directory), "")

    def export(self, iteration: int, iter_dir: str) -> Path:
        """The export of `iter_dir` in the jobs' cache, made now if it is not there (the job's export step then
        finds it); DeploymentError with the exporter's last lines if it fails (parity refused, unreadable)."""
        from ckpteval.job.hf_export import export_step

        compiled = self.compile_first(iteration, iter_dir)
        link_dir = self.directory / EXPORTS / str(iteration)
        link_dir.mkdir(parents=True, exist_ok=True)
        step = export_step(
            compiled, job_dir=str(link_dir), python=sys.executable, containers=False, mounts=(), pinned=None
        )
        argv = shlex.split(step.command.removeprefix("exec "))
        done = subprocess.run(argv, capture_output=True, text=True, env={**_offline_env(), **step.env})
        link = link_dir / "hf_export"
        if done.returncode != 0 or not link.exists():
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])[-400:]
            raise DeploymentError(f"its export failed ({tail or f'exit {done.returncode}'})")
        return link.resolve()

    def start(self, iteration: int, iter_dir: str, export: Path | None = None) -> str:
        """Start the kept SGLang on `export` (`iter_dir`'s) with the evaluation's deployment options (its own port,
        written in the load directory once it serves) and wait until it serves; DeploymentError if it does not."""
        from ckpteval.deploy.commands import sglang_command
        from ckpteval.deploy.sglang_inplace import PORT_FILE
        from ckpteval.execution.processes import process_start_time

        export = export or self.export(iteration, iter_dir)
        self.stop_leftover()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        (self.directory / PORT_FILE).unlink(missing_ok=True)
        deployment = self.compile_first(iteration, iter_dir).config.deployment
        port = _free_port()
        line = sglang_command(
            deployment, port=port, model=str(export), identity=f"{self.run}-kept", python=sys.executable
        )
        log_path = self.directory / "server.log"
        started = time.monotonic()
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", "exec " + line],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=_offline_env(),
            )
        (self.directory / PID_FILE).write_text(f"{self.process.pid} {process_start_time(self.process.pid)}\n")
        url = f"http://127.0.0.1:{port}/health"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise DeploymentError(f"The kept SGLang deployment did not start; its log: {log_path}")
            time.sleep(0.5)
        (self.directory / PORT_FILE).write_text(f"{port}\n")
        return (
            f"iteration {iteration}: started the kept deployment ({time.monotonic() - started:.0f} s; "
            f"pid {self.process.pid}, log {log_path})"
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False
