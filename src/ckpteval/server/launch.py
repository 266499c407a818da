"""Starting the builtin server as a job's deployment: its command line and the health wait (stdlib only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from ckpteval.errors import DeploymentError
from ckpteval.routes import HEALTH
from ckpteval.server.options import ServeOptions

HEALTH_ROUTE = HEALTH


def serve_command(*, python: str, **options: Any) -> list[str]:
    """The argv that starts the server (`python -m ckpteval.server serve ...`), for a job script: the flags of
    `ServeOptions(**options)` (`ServeOptions.to_argv`). With `port_file` it also falls back to a port the
    kernel assigns when `port` is taken (`port_fallback`), and writes the one it holds there. Quote each
    element (shlex.quote) when rendering it into a shell script.
    """
    options.setdefault("port_fallback", options.get("port_file") is not None)
    return ServeOptions(**options).to_argv(python)


def health_url(base_url: str) -> str:
    """The health route under a server's base URL (with or without a trailing /v1)."""
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + HEALTH_ROUTE


def wait_until_healthy(
    url: str,
    *,
    timeout: float,
    process: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
    log_path: Path | None = None,
) -> None:
    """Poll `url` (a health URL, or the server's base URL) until it answers {"status": "healthy"}.

    Raises DeploymentError, with the tail of `log_path`, when `process` exits first or `timeout`
    seconds pass.
    """
    target = url if url.rstrip("/").endswith(HEALTH_ROUTE) else health_url(url)
    deadline = time.monotonic() + timeout
    delay = 0.2
    last_problem = "no answer yet"
    while True:
        if process is not None and process.poll() is not None:
            raise DeploymentError(
                f"The model server exited with code {process.returncode} before it became healthy."
                + _log_tail(log_path),
                hint=f"Its full log: {log_path}" if log_path else None,
            )
        try:
            with urllib.request.urlopen(target, timeout=5) as response:
                if json.loads(response.read() or b"{}").get("status") == "healthy":
                    return
                last_problem = "it answered, but not healthy"
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError) as exc:
            last_problem = str(getattr(exc, "reason", exc))
        if time.monotonic() >= deadline:
            raise DeploymentError(
                f"The model server at {target} was not healthy after {timeout:.0f} s ({last_problem})."
                + _log_tail(log_path),
                hint="Loading a large checkpoint can take long: raise the deployment's health timeout, "
                "or read the server log.",
            )
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 1.5, 2.0)


def _log_tail(log_path: Path | None, lines: int = 15) -> str:
    if log_path is None:
        return ""
    try:
        with open(log_path, errors="replace") as handle:
            tail = deque(handle, maxlen=lines)
    except OSError:
        return ""
    text = "".join(tail).rstrip()
    return f"\nLast lines of {log_path}:\n{text}" if text else ""


@dataclass
class LocalServer:
    """A server subprocess on this machine (see `start_local_server`); a context manager that stops it."""

    process: subprocess.Popen[bytes]
    url: str  # http://host:port, without /v1
    log_path: Path

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (in-flight requests finish), SIGKILL after `timeout`; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def start_local_server(
    *, log_path: Path, timeout: float = 600.0, python: str = sys.executable, **options: Any
) -> LocalServer:
    """Start the server with `options` (`ServeOptions`' fields: checkpoint, port, served_model_name, ...) as a
    subprocess logging to `log_path` and wait until it is healthy.

    Raises DeploymentError (with the log's tail) if it exits or is not healthy within `timeout`;
    the process is killed then.
    """
    served = ServeOptions(**options)
    command = served.to_argv(python)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = LocalServer(process=process, url=f"http://{served.host}:{served.port}", log_path=log_path)
    try:
        wait_until_healthy(server.url, timeout=timeout, process=process, log_path=log_path)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return server
