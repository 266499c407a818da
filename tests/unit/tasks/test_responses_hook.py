"""lm-eval without nemo-evaluator's proxy keeps resume, progress and a repeat's params: real lm-eval, started
as the job starts it (the hook directory first on PYTHONPATH, `CKPTEVAL_CLIENT_OUTPUT` set), against a real
HTTP server that records every body it receives and answers by the body's seed."""

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
from ckpteval.tasks.progress import read_progress

# both of lm-eval's request paths: the async batch (num_concurrent > 1) and the plain call (1); sampled
# generation (do_sample), which lm-eval's own cache never answers
HARNESS = """
import json, sys
from lm_eval.api.instance import Instance
from lm_eval.models.openai_completions import LocalCompletionsAPI

url, concurrent, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = LocalCompletionsAPI(base_url=url, model="m", tokenizer_backend=None, tokenized_requests=False,
                            num_concurrent=concurrent, timeout=30, max_retries=1)
gen = {"until": ["\\\\n"], "max_gen_toks": 4, "do_sample": True, "temperature": 0.7}
reqs = [Instance("generate_until", {}, (f"p{i}", dict(gen)), i) for i in range(n)]
print(json.dumps(model.generate_until(reqs)), flush=True)
"""


class _Handler(BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.bodies.append(body)
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        text = f" {prompts[0]}@seed{body.get('seed')}"
        data = json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.bodies = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1/completions"
    httpd.shutdown()


def run(url: str, output: Path, *, concurrent: int, n: int, params: dict | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTEVAL_") and k != "PYTHONPATH"}
    env.update({"PYTHONPATH": hook_dir(), responses.OUTPUT_ENV: str(output)})
    if params:
        env[responses.PARAMS_ENV] = json.dumps(params)
    argv = [sys.executable, "-c", HARNESS, url, str(concurrent), str(n)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("concurrent", [3, 1])
def test_params_cache_progress_and_stats_without_the_proxy(server: str, tmp_path: Path, concurrent: int) -> None:
    out = tmp_path / "output"
    first = run(server, out, concurrent=concurrent, n=6, params={"seed": 2, "top_k": 5})
    # every body carried the repeat's params over lm-eval's own seed (1234)
    assert len(_Handler.bodies) == 6
    assert {(b["seed"], b["top_k"]) for b in _Handler.bodies} == {(2, 5)}
    assert sorted(first) == sorted(f" p{i}@seed2" for i in range(6))
    assert (out / "progress").read_text() == "6" and read_progress(out).done == 6
    stats = json.loads((out / "eval_factory_metrics.json").read_text())["response_stats"]
    assert (stats["count"], stats["successful_count"], stats["replayed_count"]) == (6, 6, 0)
    assert list(stats["inference_run_times"]) == ["0"]

    # the same run again (a resumed job): every answer replayed, nothing sent, same answers, progress kept
    again = run(server, out, concurrent=concurrent, n=6, params={"seed": 2, "top_k": 5})
    assert again == first and len(_Handler.bodies) == 6
    assert (out / "progress").read_text() == "6"
    # a longer run in the same directory asks only for what is new; another seed is another request
    more = run(server, out, concurrent=concurrent, n=8, params={"seed": 2, "top_k": 5})
    assert more[:6] == first and more[6:] == [" p6@seed2", " p7@seed2"]
    assert sorted(b["prompt"] for b in _Handler.bodies[6:]) == ["p6", "p7"]
    assert (out / "progress").read_text() == "8"
    stats = json.loads((out / "eval_factory_metrics.json").read_text())["response_stats"]
    assert (stats["count"], stats["replayed_count"]) == (8, 12) and len(stats["inference_run_times"]) == 2
    run(server, out, concurrent=concurrent, n=1, params={"seed": 3, "top_k": 5})
    assert _Handler.bodies[-1]["seed"] == 3 and len(_Handler.bodies) == 9


def test_without_the_output_variable_the_hook_stays_out(server: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTEVAL_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = hook_dir()
    argv = [sys.executable, "-c", HARNESS, server, "2", "3"]
    for _ in range(2):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    # lm-eval's own seed, every request sent both times, nothing written
    assert [b["seed"] for b in _Handler.bodies] == [1234] * 6
    assert not list(tmp_path.iterdir())


def test_a_cache_line_cut_short_by_a_kill_is_skipped(server: str, tmp_path: Path) -> None:
    out = tmp_path / "output"
    run(server, out, concurrent=2, n=3, params={"seed": 0})
    cache = out / responses.CACHE_FILE
    lines = cache.read_text().splitlines()
    cache.write_text("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])  # the last write cut short
    run(server, out, concurrent=2, n=3, params={"seed": 0})
    assert len(_Handler.bodies) == 4  # only the request whose line was cut is asked again


class _EchoOnce(_Handler):
    """Answers each prompt's first request with the prompt echoed in front (what a batch that applied a
    log-likelihood request's `echo` to it returns), every later one as asked."""

    seen: ClassVar[set[str]] = set()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0]
        with self.lock:
            self.bodies.append(body)
            first = prompt not in self.seen
            self.seen.add(prompt)
        text = f"{prompt} answer" if first else " answer"
        data = json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


ECHO_HARNESS = HARNESS.replace("max_retries=1", "max_retries=3").replace(
    '(f"p{i}", dict(gen))', '(f"A question long enough to tell, number {i}:", dict(gen))'
)


@pytest.mark.parametrize("concurrent", [3, 1])
def test_a_generation_answered_with_its_prompt_echoed_is_an_error_not_a_score(tmp_path: Path, concurrent: int) -> None:
    _EchoOnce.bodies, _EchoOnce.seen = [], set()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _EchoOnce)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    out = tmp_path / "output"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTEVAL_") and k != "PYTHONPATH"}
    env.update({"PYTHONPATH": hook_dir(), responses.OUTPUT_ENV: str(out)})
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/completions"
    try:
        done = subprocess.run(
            [sys.executable, "-c", ECHO_HARNESS, url, str(concurrent), "3"],
            capture_output=True, text=True, env=env, timeout=180,
        )  # fmt: skip
    finally:
        httpd.shutdown()
    assert done.returncode == 0, done.stderr[-3000:]
    # every echoed answer was refused and asked again: what lm-eval scores is the model's own answer
    assert json.loads(done.stdout.splitlines()[-1]) == [" answer"] * 3
    assert len(_EchoOnce.bodies) == 6
    assert done.stderr.count("came back with its prompt echoed") == 3
    stats = json.loads((out / "eval_factory_metrics.json").read_text())["response_stats"]
    assert (stats["echoed_count"], stats["successful_count"]) == (3, 3)
    cached = [json.loads(line)["response"] for line in (out / responses.CACHE_FILE).read_text().splitlines()]
    assert [c["choices"][0]["text"] for c in cached] == [" answer"] * 3  # no echoed answer kept for a resume
    # the harness's versions, as installed where it ran
    ran = json.loads((out / responses.VERSIONS_FILE).read_text())
    assert ran["python"] == ".".join(map(str, sys.version_info[:3])) and "nvidia-lm-eval" in ran["packages"]


def test_what_counts_as_another_request_s_settings(tmp_path: Path) -> None:
    """The two answers a batch with another request's settings gives lm-eval: a generation with its prompt in
    front, a log-likelihood request without log-probabilities. Neither is replayed from the cache either."""
    prompt = "A question long enough to tell:"
    generation = {"prompt": prompt, "max_tokens": 4}
    scoring = {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 1}

    def answer(text: str, logprobs: dict | None = None) -> dict:
        return {"choices": [{"index": 0, "text": text, "logprobs": logprobs}]}

    assert responses.echoed(generation, answer(prompt + " B"))
    assert not responses.echoed(generation, answer(" B"))
    assert not responses.echoed(scoring, answer(prompt + " B", {"token_logprobs": [-1.0]}))  # it asked for the echo
    assert not responses.echoed({"prompt": "Q:", "max_tokens": 4}, answer("Q: A"))  # too short to tell
    assert not responses.echoed({"prompt": [1, 2, 3]}, answer("[1, 2, 3]"))  # token ids: not checked
    assert responses.without_logprobs(scoring, answer(prompt + " B"))
    assert not responses.without_logprobs(scoring, answer(prompt + " B", {"token_logprobs": [-1.0]}))
    assert not responses.without_logprobs(generation, answer(" B"))

    recorder = responses.Recorder(tmp_path)
    with pytest.raises(responses.EchoedPrompt):
        recorder.check_echo(scoring, answer(prompt + " B"))
    with pytest.raises(responses.EchoedPrompt):
        recorder.check_echo(generation, answer(prompt + " B"))
    recorder.check_echo(generation, answer(" B"))
    assert (recorder.echoed, recorder.without_logprobs) == (1, 1)
    # a bad answer a run before this check cached is asked again, not replayed
    key = responses.request_key(generation)
    recorder._answers[key] = answer(prompt + " B")
    assert recorder.cached(generation) == (key, None)
