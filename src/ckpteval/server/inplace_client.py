"""Asking a running builtin server to load another checkpoint in place (`server.inplace`), from this machine.

A server that loads in place is started with a *load directory* (`load_dir_options`): it writes the port it
holds to `<dir>/port` and its load secret to `<dir>/secret` (mode 0600). Whoever can read the directory may
ask it to load (`load_in_place`); the job of an invocation does it through its deployment step,
`python -m ckpteval.server serve --load-into DIR ...` (`stand_in`): instead of starting a server it has the
kept one load the invocation's checkpoint under the invocation's identity, writes the port and what was
loaded where the job reads them (as a server it started would), and stands for the deployment until the job
stops it (the kept server goes on). Stdlib only.
"""

from __future__ import annotations

import json
import signal
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.errors import DeploymentError

PORT_FILE = "port"
SECRET_FILE = "secret"
LOAD_ROUTE = "/v1/load"  # served by `server.inplace` (torch-side); declared here, where stdlib code reads it
SECRET_HEADER = "x-ckpteval-load-secret"


def load_dir_options(directory: Path) -> dict[str, Path]:
    """The `ServeOptions` fields that make a server loadable in place through `directory`."""
    return {"port_file": directory / PORT_FILE, "load_secret_file": directory / SECRET_FILE}


@dataclass(frozen=True)
class LoadAnswer:
    """What the server answered: `loaded` (the new checkpoint serves), else `refused` (why it cannot be loaded
    into this server: it still serves what it did) or a failure (`message`: it now serves nothing)."""

    status: int
    loaded: bool
    checkpoint: dict[str, Any] | None
    refused: tuple[str, ...]
    message: str
    seconds: float = 0.0
    weights_read: bool = True


def server_url(directory: Path) -> str:
    """The base URL of the server whose load directory `directory` is."""
    try:
        port = int((directory / PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        raise DeploymentError(
            f"No server that loads in place runs from {directory} (no port written there).",
            hint="Start a fresh deployment instead (drop deployment.load_into).",
        ) from None
    return f"http://127.0.0.1:{port}"


def load_in_place(
    directory: Path,
    checkpoint: str,
    *,
    iteration: str | None = None,
    identity: str | None = None,
    check: bool = False,
    timeout: float = 3600.0,
) -> LoadAnswer:
    """Ask the server of `directory` to load `checkpoint` (`check`: only whether it could); DeploymentError when
    it cannot be asked (not running, the secret unreadable)."""
    url = server_url(directory) + LOAD_ROUTE
    try:
        secret = (directory / SECRET_FILE).read_text().strip()
    except OSError as exc:
        raise DeploymentError(f"The load secret of {directory} cannot be read: {exc.strerror}.") from None
    body = {"checkpoint": checkpoint, "iteration": iteration, "identity": identity, "check": check}
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", SECRET_HEADER: secret},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, payload = response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
        try:
            payload = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            payload = {}
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise DeploymentError(f"The server at {url} did not answer the load: {getattr(exc, 'reason', exc)}.") from None
    message = ((payload.get("error") or {}).get("message")) or ""
    return LoadAnswer(
        status=status,
        loaded=bool(payload.get("loaded")),
        checkpoint=payload.get("checkpoint"),
        refused=tuple(payload.get("refused") or ()),
        message=message,
        seconds=float(payload.get("seconds") or 0.0),
        weights_read=bool(payload.get("weights_read", True)),
    )


def stand_in(options: Any) -> None:
    """`serve --load-into DIR` (`options`: `ServeOptions`): load `options.checkpoint` into DIR's server under
    `options.identity`, write its port (`port_file`) and the report (`report_file`) once the new checkpoint
    serves, then wait until SIGTERM or Ctrl-C. DeploymentError (the job's deployment then fails, saying why)
    when the load is refused or fails."""
    from ckpteval.server.announce import publish_port, say
    from ckpteval.server.loaded import write_report

    directory = Path(options.load_into)
    say(f"Loading {options.checkpoint} in place into the server of {directory} ...")
    answer = load_in_place(directory, str(options.checkpoint), iteration=options.iteration, identity=options.identity)
    if not answer.loaded:
        raise DeploymentError(
            answer.message or f"The server of {directory} did not load {options.checkpoint} (HTTP {answer.status}).",
            hint="Start a fresh deployment for this checkpoint (drop deployment.load_into)."
            if answer.refused
            else None,
        )
    checkpoint = answer.checkpoint or {}
    if options.report_file is not None:
        write_report(options.report_file, checkpoint)
    port = int((directory / PORT_FILE).read_text().strip())
    if options.port_file is not None:
        publish_port(options.port_file, port)
    content = (checkpoint.get("content") or {}).get("sha256", "")[:12]
    how = "weights read" if answer.weights_read else "the checkpoint it held: no weights read"
    say(
        f"Loaded in place in {answer.seconds:.1f} s ({how}): {checkpoint.get('path')} "
        f"(content {content}), serving on port {port}. Standing for it until stopped."
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _s, _f: stop.set())
    stop.wait()
    say("Stopped (the server goes on serving).")
