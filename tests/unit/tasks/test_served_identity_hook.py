"""Every answer names what answered it, and the task client checks each one: real lm-eval, started as the job
starts it (the hook directory first on PYTHONPATH, the job's variables set), against a real HTTP server that
answers as the builtin server does (its /v1/health reports the deployment and the checkpoint content, every
response carries `x-ckpteval-deployment` and `x-ckpteval-checkpoint`: tests/unit/server/test_served_checkpoint.py
checks that the real server does). The server is swapped mid-task, or serves another checkpoint on resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from ckpteval.tasks.client import hook_dir
from ckpteval.tasks.harness_hook import ckpteval_responses as responses

HARNESS = """
import json, sys
from lm_eval.api.instance import Instance
from lm_eval.models.openai_completions import LocalCompletionsAPI

url, n = sys.argv[1], int(sys.argv[2])
model = LocalCompletionsAPI(base_url=url, model="megatron-model", tokenizer_backend=None,
                            tokenized_requests=False, num_concurrent=1, timeout=30, max_retries=1)
gen = {"until": ["\\\\n"], "max_gen_toks": 4, "do_sample": True, "temperature": 0.7}
reqs = [Instance("generate_until", {}, (f"p{i}", dict(gen)), i) for i in range(n)]
print(json.dumps(model.generate_until(reqs)), flush=True)
"""
OURS = "inv00001-aaaaaaaaaaaa"
C1, C2 = "c1" * 32, "c2" * 32


class _Builtin(BaseHTTPRequestHandler):
    """Answers like the builtin server; after `swap_after` answers another deployment holds the port."""

    identity: ClassVar[str] = OURS
    checkpoint: ClassVar[str] = C1
    swap_after: ClassVar[int | None] = None
    posts: ClassVar[list[str]] = []
    lock = threading.Lock()

    def _send(self, payload: dict, identity: str, checkpoint: str) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-ckpteval-deployment", identity)
        self.send_header("x-ckpteval-checkpoint", checkpoint)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        cls = type(self)
        health = {
            "status": "healthy",
            "deployment": cls.identity,
            "checkpoint": {"content": {"sha256": cls.checkpoint}},
        }
        self._send(health, cls.identity, cls.checkpoint)

    def do_POST(self) -> None:
        cls = type(self)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            cls.posts.append(body["prompt"])
            if cls.swap_after is not None and len(cls.posts) > cls.swap_after:
                # the job's server died; another with the same served name took the port
                cls.identity, cls.checkpoint = "other000-bbbbbbbbbbbb", C2
        text = f" {body['prompt']}@{cls.checkpoint[:2]}"
        self._send({"choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}, cls.identity, cls.checkpoint)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Builtin.identity, _Builtin.checkpoint, _Builtin.swap_after, _Builtin.posts = OURS, C1, None, []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Builtin)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def run(base: str, output: Path, n: int) -> subprocess.CompletedProcess[str]:
    """A task client as the job starts it against the builtin deployment `OURS`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTEVAL_") and k != "PYTHONPATH"}
    env.update(
        {
            "PYTHONPATH": hook_dir(),
            responses.OUTPUT_ENV: str(output),
            "CKPTEVAL_DEPLOYMENT_HEALTH": f"{base}/v1/health",
            "CKPTEVAL_DEPLOYMENT_IDENTITY": OURS,
            "CKPTEVAL_DEPLOYMENT_IDENTITY_URL": f"{base}/v1/health",
            responses.NAMED_ENV: "1",
        }
    )
    argv = [sys.executable, "-c", HARNESS, f"{base}/v1/completions", str(n)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180)


def test_a_server_replaced_mid_task_fails_the_task_naming_it(server: str, tmp_path: Path) -> None:
    from ckpteval.tasks.failure import explain_log

    _Builtin.swap_after = 3
    done = run(server, tmp_path / "output", n=8)
    assert done.returncode == responses.IDENTITY_CHANGED_EXIT, done.stderr[-2000:]
    assert not done.stdout.strip()  # lm-eval returned no answers: nothing can be scored
    assert len(_Builtin.posts) == 4  # the first foreign answer stopped it
    why = explain_log(done.stderr, log="client.log")
    assert "other000-bbbbbbbbbbbb" in why.reason and OURS in why.reason and "another server" in why.reason


def test_resume_against_another_checkpoint_replays_nothing_and_the_record_says_so(server: str, tmp_path: Path) -> None:
    from ckpteval.results.collect import refuse_unserved
    from ckpteval.results.model import Metric, TaskOutcome
    from ckpteval.results.provenance import Provenance, task_served

    out = tmp_path / "task" / "output"
    assert run(server, out, n=4).returncode == 0 and len(_Builtin.posts) == 4
    _Builtin.checkpoint = C2  # iter_N rewritten (a restarted training) before `evaluate resume`
    resumed = run(server, out, n=4)
    assert resumed.returncode == 0 and len(_Builtin.posts) == 8  # every answer asked again: none replayed
    assert json.loads(resumed.stdout.splitlines()[-1]) == [f" p{i}@c2" for i in range(4)]
    again = run(server, out, n=4)
    assert again.returncode == 0 and len(_Builtin.posts) == 8  # same checkpoint: all replayed
    served = task_served(tmp_path / "task")
    assert served["runs"] == 3 and served["checkpoints"] == sorted([C1, C2])
    assert served["answered"] == 8 and served["replayed"] == {"ckpteval": 4, "lm_eval": 0}
    assert served["not_replayed_other_checkpoint"] == 4
    # collected: the task's runs saw two contents, so its score is refused, saying so
    outcome = TaskOutcome(name="t", status="succeeded", metrics={"acc": Metric(0.5, 0.1, 4)})
    provenance = Provenance(checkpoint={"source": "server", "files_sha256": C2}, tasks={"t": {"served": served}})
    refused = refuse_unserved(outcome, provenance)
    assert refused.status == "failed" and not refused.metrics
    assert refused.error is not None and "2 checkpoint contents" in refused.error


CACHING = """
import json, sys
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM, CachingLM

class Model(LM):
    def loglikelihood(self, requests):
        out = []
        for r in requests:
            self.cache_hook.add_partial("loglikelihood", r.args, (-1.0, True))
            out.append((-1.0, True))
        print("asked", len(requests), file=sys.stderr)
        return out
    def loglikelihood_rolling(self, requests): raise NotImplementedError
    def generate_until(self, requests): raise NotImplementedError

lm = CachingLM(Model(), sys.argv[1])
reqs = [Instance("loglikelihood", {}, (f"c{i}", " x"), i) for i in range(3)]
print(json.dumps(lm.loglikelihood(reqs)))
"""


def test_lm_evals_own_cache_replays_only_the_checkpoint_served_and_is_counted(server: str, tmp_path: Path) -> None:
    """lm-eval's `--use_cache` (CachingLM): keyed by the content served, its replays counted in served.json."""
    from ckpteval.results.provenance import task_served

    out = tmp_path / "task" / "output"
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTEVAL_") and k != "PYTHONPATH"}
    env.update(
        {"PYTHONPATH": hook_dir(), responses.OUTPUT_ENV: str(out), "CKPTEVAL_DEPLOYMENT_HEALTH": f"{server}/v1/health"}
    )
    argv = [sys.executable, "-c", CACHING, str(out / "lm_cache" / "rank0")]

    def once() -> str:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stderr

    assert "asked 3" in once()
    assert "asked" not in once()  # the same content: lm-eval's cache answers all three
    _Builtin.checkpoint = C2  # iter_N rewritten before the resume
    assert "asked 3" in once()  # another content: nothing replayed from lm-eval's cache
    served = task_served(tmp_path / "task")
    assert served["replayed"] == {"ckpteval": 0, "lm_eval": 3}
