"""request_timeout bounds one request, never its wait in the queue: real lm-eval against a real HTTP server.

The harness runs in a subprocess started the way the job starts it (the hook directory first on
PYTHONPATH, so `sitecustomize` installs the patch); the server answers every request in 0.1 s, so a run
of 200 requests at parallelism 2 lasts ~10 s, five times the 2 s timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ckpteval.tasks.client import hook_dir
from ckpteval.tasks.harness_hook.ckpteval_request_timeout import timeout_message
from ckpteval.tasks.results import failure_error

ANSWER_S = 0.1
TIMEOUT_S = 2  # request_timeout (HARNESS says 2 too); generous for a loaded machine
N_LONG = 200  # at parallelism 2: ~10 s, five times the timeout
SLOW_PROMPT = "take your time"

# Runs the scenarios given as arguments in one process (importing lm-eval takes ~10 s here); for each, one
# JSON line on stdout and, if it failed, its traceback on stderr as lm-eval would print it.
HARNESS = """
import inspect, json, sys, time, traceback
from lm_eval.api.instance import Instance
from lm_eval.models.api_models import TemplateAPI
from lm_eval.models.openai_completions import LocalCompletionsAPI

patched = TemplateAPI.get_batched_requests
url, TIMEOUT = sys.argv[1], 2
for scenario in sys.argv[2:]:
    name, n, first = scenario.split(":")
    print("=== scenario", name, file=sys.stderr, flush=True)
    # "unpatched": the harness's own method, under the hook's wrappers (functools.wraps keeps each one's)
    TemplateAPI.get_batched_requests = inspect.unwrap(patched) if name == "unpatched" else patched
    model = LocalCompletionsAPI(base_url=url, model="m", tokenizer_backend=None, tokenized_requests=False,
                                num_concurrent=2, timeout=TIMEOUT, max_retries=1)
    prompts = [first] + [f"prompt {i:04d}" for i in range(1, int(n))]
    args = {"until": ["\\n"], "max_gen_toks": 4}
    reqs = [Instance("generate_until", {}, (p, dict(args)), i) for i, p in enumerate(prompts)]
    start = time.monotonic()
    try:
        answers = model.generate_until(reqs)
        out = {"answers": answers}
    except Exception as exc:
        traceback.print_exc()
        out = {"error": type(exc).__name__}
    print(json.dumps({"scenario": name, "seconds": time.monotonic() - start, **out}), flush=True)
"""


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        time.sleep(2 * TIMEOUT_S if SLOW_PROMPT in prompts else ANSWER_S)
        answer = {"choices": [{"index": i, "text": " ok", "finish_reason": "stop"} for i in range(len(prompts))]}
        data = json.dumps(answer).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up on this request
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1/completions"
    httpd.shutdown()


@pytest.fixture(scope="module")
def harness(server: str) -> tuple[dict[str, dict], dict[str, str]]:
    """The scenarios' outcomes by name, and each one's stderr (its log)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "PYTHONPATH": hook_dir()}
    # the control last: the requests it leaves behind time out while the process ends
    scenarios = [f"slow:4:{SLOW_PROMPT}", f"long:{N_LONG}:prompt 0000", f"unpatched:{N_LONG}:prompt 0000"]
    done = subprocess.run(
        [sys.executable, "-c", HARNESS, server, *scenarios], capture_output=True, text=True, env=env, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = {o["scenario"]: o for o in map(json.loads, done.stdout.splitlines())}
    logs = {part.split("\n", 1)[0].strip(): part for part in done.stderr.split("=== scenario ")[1:]}
    return outcomes, logs


@pytest.mark.slow
def test_a_run_many_times_longer_than_the_timeout_completes(harness) -> None:
    long = harness[0]["long"]
    assert long.get("answers") == [" ok"] * N_LONG, long
    # the run must last several times request_timeout for this test to mean anything
    assert long["seconds"] > 3 * TIMEOUT_S


@pytest.mark.slow
def test_without_the_patch_the_same_run_dies_of_the_queue(harness) -> None:
    """The harness's own behaviour (NVIDIA-NeMo/Evaluator#974): the control that makes the test above count."""
    assert harness[0]["unpatched"].get("error") == "TimeoutError"


@pytest.mark.slow
def test_a_request_slower_than_the_timeout_still_fails_and_says_which_setting(harness, server: str, tmp_path) -> None:
    assert harness[0]["slow"].get("error") == "RequestTimeoutError"
    assert "ckpteval_request_timeout.RequestTimeoutError: " + timeout_message(TIMEOUT_S, server) in harness[1]["slow"]
    # what the user is told about the failed task, from its client log
    log = tmp_path / "client.log"
    log.write_text(harness[1]["slow"])
    error = failure_error(tmp_path / "output", log)
    assert "request_timeout" in error.message and "timed out" in error.message
