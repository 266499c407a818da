"""Helpers shared by the deploy tests: a real server subprocess and a small HTTP client."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ckpteval.deploy import serve_command, wait_until_healthy

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
    """A `python -m ckpteval.deploy serve` subprocess."""

    process: subprocess.Popen[bytes]
    url: str  # http://127.0.0.1:PORT
    log_path: Path

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return request_json("POST", self.url + path, body)

    def get(self, path: str) -> tuple[int, Any]:
        return request_json("GET", self.url + path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_server(checkpoint: Path, log_dir: Path, *extra: str, name: str = "megatron-model") -> RunningServer:
    """Start a server on a free port and wait until /v1/health answers."""
    port = free_port()
    command = serve_command(
        python=sys.executable, checkpoint=str(checkpoint), port=port, served_model_name=name, device="cpu"
    )
    log_path = log_dir / f"server-{port}.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen([*command, *extra], stdout=log, stderr=subprocess.STDOUT, env=env)
    server = RunningServer(process=process, url=f"http://127.0.0.1:{port}", log_path=log_path)
    try:
        wait_until_healthy(server.url, timeout=SERVER_START_TIMEOUT, process=process, log_path=log_path)
    except BaseException:
        server.stop(signal.SIGKILL)
        raise
    return server


def score_directly(model: Any, tokens: list[int]) -> list[float]:
    """log p(token[i+1] | tokens[:i+1]) from one plain forward of the megatron model (no server code)."""
    import torch

    from ckpteval.deploy.packaged import megatron_logits

    ids = torch.tensor([tokens])
    logprobs = torch.log_softmax(megatron_logits(model, ids)[0].float(), dim=-1)
    return logprobs[:-1].gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()


def greedy_directly(model: Any, tokens: list[int], steps: int, stop_ids: frozenset[int]) -> list[int]:
    """Greedy tokens from full forwards over the growing sequence (no KV cache, no server code)."""
    import torch

    from ckpteval.deploy.packaged import megatron_logits

    out: list[int] = []
    for _ in range(steps):
        token = int(megatron_logits(model, torch.tensor([tokens + out]))[0, -1].argmax())
        if token in stop_ids:
            break
        out.append(token)
    return out
