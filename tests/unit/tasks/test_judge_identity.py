"""A judge the job deployed beside the model is checked by every judged task as the model is: before its
harness sends anything (it waits for the judge's health, which must report the identity the job gave it), and
on every answer (MT-Bench's OpenAI client, patched by the harness hook: each judge answer must name that
identity). Real HTTP servers; the patched client runs in a process of its own, as in a task."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ckpteval.tasks.client import hook_dir
from ckpteval.tasks.harness_hook.ckpteval_judge import deployed_judge_problem

pytest.importorskip("openai")


def _server(identity: str) -> ThreadingHTTPServer:
    """A judge-shaped server naming `identity` in its health and on every answer, as the builtin server does."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: dict) -> None:  # type: ignore[type-arg]
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("x-ckpteval-deployment", identity)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.startswith("/v1/health"):
                self._send({"status": "healthy", "deployment": identity})
            else:
                self._send({"data": [{"id": "judge", "deployment": identity}]})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            message = {"role": "assistant", "content": "Rating: [[7]]"}
            self._send(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "judge",
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                }
            )

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def judge() -> Iterator[str]:
    server = _server("job-judge-1")
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_the_check_before_any_request_wants_the_jobs_judge(judge: str) -> None:
    assert deployed_judge_problem(judge, "job-judge-1", wait_s=5) is None
    problem = deployed_judge_problem(judge, "job-judge-2", wait_s=5)
    assert problem and "reports deployment job-judge-1, not this job's judge job-judge-2" in problem
    nothing = deployed_judge_problem("http://127.0.0.1:9/v1", "job-judge-1", wait_s=0.5, poll_s=0.1)
    assert nothing and "did not become healthy within 0 s" in nothing


# MT-Bench's client module as its judging subprocess imports it (from its own directory), the harness hook
# loaded at start-up from PYTHONPATH as in a task
CLIENT = """
import sys
from fastchat.clients.openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key="none", max_retries=0)
reply = client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "rate"}])
print("judged:", reply.choices[0].message.content)
"""


def _judge_client(tmp_path: Path, url: str, identity: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "fastchat"
    (fake / "clients").mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("")
    (fake / "clients" / "__init__.py").write_text("")
    (fake / "clients" / "openai.py").write_text("from openai import OpenAI\n")  # as MT-Bench's module imports it
    env = {
        "CKPTEVAL_JUDGE_URL": url,
        "CKPTEVAL_JUDGE_IDENTITY": identity,
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{hook_dir()}:{tmp_path}",
    }
    return subprocess.run(
        [sys.executable, "-c", CLIENT, url],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_every_judge_answer_must_name_the_jobs_judge(tmp_path: Path, judge: str) -> None:
    ok = _judge_client(tmp_path, judge, "job-judge-1")
    assert ok.returncode == 0, ok.stderr
    assert "judged: Rating: [[7]]" in ok.stdout
    other = _judge_client(tmp_path, judge, "job-judge-2")
    assert other.returncode == 3
    assert "the judge changed mid-task" in other.stderr and "not this job's judge job-judge-2" in other.stderr
    assert "judged:" not in other.stdout
