"""Helpers shared by the deploy tests: a real server subprocess and a small HTTP client."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ckpteval.server.launch import LocalServer, start_local_server

SERVER_START_TIMEOUT = 300.0  # megatron's import alone takes ~20 s on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def request_json(method: str, url: str, body: Any = None, *, timeout: float = 120.0) -> tuple[int, Any]:
    """One request; `body` is JSON-encoded unless it is bytes. Returns (status, decoded JSON)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        connection.request(method, parts.path, body=data, headers=headers)
        response = connection.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None
    finally:
        connection.close()


@dataclass
class RunningServer:
    """A `python -m ckpteval.server serve` subprocess, with JSON helpers."""

    handle: LocalServer

    @property
    def url(self) -> str:
        return self.handle.url

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.handle.process

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return request_json("POST", self.url + path, body)

    def get(self, path: str) -> tuple[int, Any]:
        return request_json("GET", self.url + path)

    def log(self) -> str:
        return self.handle.log_path.read_text(errors="replace")

    def stop(self) -> int:
        return self.handle.stop()


def start_server(checkpoint: Path, log_dir: Path, *, name: str = "megatron-model") -> RunningServer:
    """Start a server on a free port (as the builtin deployment does) and wait until it is healthy."""
    port = free_port()
    handle = start_local_server(
        checkpoint=checkpoint,
        port=port,
        log_path=log_dir / f"server-{port}.log",
        served_model_name=name,
        device="cpu",
        timeout=SERVER_START_TIMEOUT,
    )
    return RunningServer(handle)


def score_directly(model: Any, tokens: list[int]) -> list[float]:
    """log p(token[i+1] | tokens[:i+1]) from one plain forward of the megatron model (no server code)."""
    import torch

    from ckpteval.server.packaged import megatron_logits

    ids = torch.tensor([tokens])
    logprobs = torch.log_softmax(megatron_logits(model, ids)[0].float(), dim=-1)
    return logprobs[:-1].gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()


def greedy_directly(model: Any, tokens: list[int], steps: int, stop_ids: frozenset[int]) -> list[int]:
    """Greedy tokens from full forwards over the growing sequence (no KV cache, no server code)."""
    import torch

    from ckpteval.server.packaged import megatron_logits

    out: list[int] = []
    for _ in range(steps):
        token = int(megatron_logits(model, torch.tensor([tokens + out]))[0, -1].argmax())
        if token in stop_ids:
            break
        out.append(token)
    return out
