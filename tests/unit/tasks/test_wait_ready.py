"""A client prepares while the model loads and sends its first request once the deployment is healthy: real
lm-eval, started as the job starts it (the hook directory first on PYTHONPATH), against a real HTTP server
that begins listening only a few seconds later, as a loading model's server does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from ckpteval.tasks.client import hook_dir
from ckpteval.tasks.harness_hook import ckpteval_wait_ready as wait_ready
from tests.support.waiting import wait_until

LOAD_S = 3.0  # the "model load" left once the client is ready: the server listens this much later

# both of lm-eval's request paths: the async batch (num_concurrent > 1) and the plain call (1)
HARNESS = """
import json, sys, time
from lm_eval.api.instance import Instance
from lm_eval.models.openai_completions import LocalCompletionsAPI

url = sys.argv[1]
print(json.dumps({"prepared": time.time()}), flush=True)
for concurrent in (2, 1):
    model = LocalCompletionsAPI(base_url=url, model="m", tokenizer_backend=None, tokenized_requests=False,
                                num_concurrent=concurrent, timeout=30, max_retries=1)
    reqs = [Instance("generate_until", {}, (f"p{i}", {"until": ["\\\\n"], "max_gen_toks": 4}), i) for i in range(4)]
    print(json.dumps({"concurrent": concurrent, "answers": model.generate_until(reqs)}), flush=True)
"""


class _Handler(BaseHTTPRequestHandler):
    arrivals: ClassVar[list[tuple[str, float]]] = []

    def _answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.arrivals.append((self.path, time.time()))
        self._answer({"status": "ok"})

    def do_POST(self) -> None:
        self.arrivals.append((self.path, time.time()))
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        self._answer({"choices": [{"index": i, "text": " ok", "finish_reason": "stop"} for i in range(len(prompts))]})

    def log_message(self, *args: object) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LateServer:
    """A server that starts listening only when told to, `delay` seconds later (a model loading)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.listening = float("inf")
        self._httpd: ThreadingHTTPServer | None = None
        _Handler.arrivals = []

    def start_in(self, delay: float) -> None:
        def start() -> None:
            time.sleep(delay)
            self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
            self._httpd.daemon_threads = True
            self.listening = time.time()
            self._httpd.serve_forever()

        threading.Thread(target=start, daemon=True).start()

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()


def client_env(port: int) -> dict[str, str]:
    """A task client's environment as the job gives it: the hook first on PYTHONPATH, the deployment's health
    URL on `port`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return env | {
        "HF_HUB_OFFLINE": "1",
        "TQDM_DISABLE": "1",
        "PYTHONPATH": hook_dir(),
        wait_ready.HEALTH_ENV: f"http://127.0.0.1:{port}/v1/health",
        wait_ready.WAIT_ENV: "60",
    }


@pytest.fixture
def late_server() -> Iterator[LateServer]:
    server = LateServer()
    yield server
    server.close()


@pytest.mark.slow
def test_lm_eval_prepares_at_once_and_sends_only_once_the_deployment_is_healthy(late_server: LateServer) -> None:
    port = late_server.port
    env = client_env(port)
    url = f"http://127.0.0.1:{port}/v1/completions"
    client = subprocess.Popen(
        [sys.executable, "-c", HARNESS, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert client.stdout is not None
    first = client.stdout.readline()  # lm-eval imported: the client is ready, the model is not
    late_server.start_in(LOAD_S)
    rest, stderr = client.communicate(timeout=600)  # a bound for a hang: lm-eval alone imports in 100 s at load 10+
    assert client.returncode == 0, stderr[-3000:]
    lines = [json.loads(line) for line in (first + rest).splitlines()]
    assert [line.get("answers") for line in lines[1:]] == [[" ok"] * 4, [" ok"] * 4]
    posts = [t for path, t in _Handler.arrivals if path == "/v1/completions"]
    health = [t for path, t in _Handler.arrivals if path == "/v1/health"]
    assert len(posts) == 8 and health and min(posts) >= min(health) >= late_server.listening
    assert "waiting for the deployment" in stderr and "first request after waiting" in stderr
    # without the hook's wait the same requests go at once and fail: the control that makes the test count
    env.pop(wait_ready.HEALTH_ENV)
    refused = subprocess.run(
        [sys.executable, "-c", HARNESS, f"http://127.0.0.1:{free_port()}/v1/completions"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert refused.returncode != 0


def test_the_endpoint_probe_runs_in_the_background_once_healthy(late_server: LateServer, monkeypatch) -> None:
    """nemo-evaluator's `verify_capabilities` returns at once (the harness goes on preparing) and probes the
    endpoint only once it is healthy."""
    port = late_server.port
    monkeypatch.setenv(wait_ready.HEALTH_ENV, f"http://127.0.0.1:{port}/v1/health")
    monkeypatch.setattr(wait_ready, "_ready", threading.Event())
    probed: list[float] = []
    module = types.ModuleType("nemo_evaluator.core.input")
    module.verify_capabilities = lambda evaluation: probed.append(time.time()) or evaluation  # type: ignore[attr-defined]
    wait_ready.patch_input(module)
    wait_ready.patch_input(module)  # idempotent
    # it returns while nothing listens yet (the deployment is started only after it has returned: had it waited
    # for it, it would not return before its 660 s limit), and probed nothing
    returned: list[object] = []
    call = threading.Thread(target=lambda: returned.append(module.verify_capabilities("evaluation")), daemon=True)  # type: ignore[attr-defined]
    call.start()
    call.join(timeout=120)
    assert returned == [True] and not probed and late_server.listening == float("inf")
    late_server.start_in(0.5)
    wait_until(lambda: probed, timeout=120, what="the probe once the deployment is healthy")
    assert probed[0] >= late_server.listening
    # healthy now: the probe runs in place, as nemo-evaluator wrote it
    assert module.verify_capabilities("again") == "again"  # type: ignore[attr-defined]


def test_without_a_deployment_to_wait_for_nothing_waits(monkeypatch) -> None:
    monkeypatch.delenv(wait_ready.HEALTH_ENV, raising=False)
    monkeypatch.setattr(wait_ready, "_ready", threading.Event())
    asked: list[str] = []
    monkeypatch.setattr(wait_ready, "healthy", lambda url, timeout=5.0: asked.append(url) or True)
    assert wait_ready.wait_for_deployment() == 0.0
    assert asked == []  # no health request: there is nothing to ask


def test_a_deployment_that_never_comes_is_waited_for_a_bounded_time(monkeypatch) -> None:
    monkeypatch.setenv(wait_ready.HEALTH_ENV, f"http://127.0.0.1:{free_port()}/v1/health")
    monkeypatch.setenv(wait_ready.WAIT_ENV, "0")
    monkeypatch.setattr(wait_ready, "_MARGIN_S", 1.0)
    monkeypatch.setattr(wait_ready, "_ready", threading.Event())
    waited = wait_ready.wait_for_deployment()
    assert 1.0 <= waited < 5


def test_a_client_pointed_at_another_deployment_refuses_it_before_any_request(late_server: LateServer) -> None:
    """Real lm-eval with the hook, given this job's deployment identity, facing a server that answers health
    but reports another identity (another job's server on the port): it exits with code 3 and says why, and
    the server received no completion request."""
    port = late_server.port
    late_server.start_in(0.0)
    env = client_env(port)
    env |= {wait_ready.IDENTITY_ENV: "inv42-5e1f", wait_ready.IDENTITY_URL_ENV: f"http://127.0.0.1:{port}/v1/health"}
    client = subprocess.run(
        [sys.executable, "-c", HARNESS, f"http://127.0.0.1:{port}/v1/completions"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,  # a bound for a hang, as above
    )
    assert client.returncode == wait_ready.WRONG_DEPLOYMENT_EXIT, client.stderr[-3000:]
    assert "answers for another deployment" in client.stderr and "inv42-5e1f" in client.stderr
    assert not [path for path, _ in _Handler.arrivals if path == "/v1/completions"]


def test_the_identity_check_passes_for_the_jobs_own_deployment(monkeypatch) -> None:
    class Reports(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = json.dumps({"status": "healthy", "deployment": "inv42-5e1f"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Reports)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/health"
        monkeypatch.setenv(wait_ready.IDENTITY_URL_ENV, url)
        monkeypatch.setenv(wait_ready.IDENTITY_ENV, "inv42-5e1f")
        assert wait_ready.identity_problem() is None
        monkeypatch.setenv(wait_ready.IDENTITY_ENV, "inv43-0000")
        problem = wait_ready.identity_problem()
        assert problem is not None and "inv43-0000" in problem and "inv42-5e1f" in problem
    finally:
        server.shutdown()
        server.server_close()
