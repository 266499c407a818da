"""A stand-in for vLLM's OpenAI server, for machines without a GPU: `vllm serve` on a Hugging Face directory,
computed by transformers.

    python -m tests.support.vllm_standin serve MODEL --port P --served-model-name NAME [NAME ...]
        [--tensor-parallel-size N] [--pipeline-parallel-size N] [--data-parallel-size N]
        [--gpu-memory-utilization F] [--trust-remote-code]

What it shares with vLLM 0.8-0.11's server (what ckpteval and the harness rely on):
- the command line `ckpteval.deploy.commands.vllm_command` writes; every served model name is answered to and
  listed by `GET /v1/models` (with `root`: the directory served, and `max_model_len`); `GET /health` is 200
  only once the model is loaded (it loads before it listens);
- `POST /v1/completions`: `prompt` as text, token ids, or a list of either (one choice each), `max_tokens`
  (16 by default; 0 with `echo`), `temperature` (0: greedy), `top_p`, `seed`, `stop`, `echo`, `logprobs`
  (k: `tokens`, `token_logprobs`, `top_logprobs` with the k best and the chosen token, `text_offset`; with
  `echo` the prompt's too, its first token's None), `usage`; text is tokenized with special tokens added;
- `POST /v1/chat/completions`: the tokenizer's chat template with the generation prompt, `max_tokens` /
  `max_completion_tokens`, `temperature`, `seed`, `stop`;
- failures as vLLM answers them: 404 `NotFoundError` for a model it does not serve ("The model `x` does not
  exist."), 400 `BadRequestError` for a malformed body or a prompt past the context, 404 for other routes;
- each request computed with its own settings (one at a time here; vLLM batches, but per-request sampling).

It also writes what it served (the directory's `ckpteval_export.json` identity, when there is one) and the
count of completions it answered to `$VLLM_STANDIN_LOG` when that is set, so a test can see which model the
engine served.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class Engine:
    """The model and tokenizer, one request at a time."""

    def __init__(self, model_dir: str, names: list[str]) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.model_dir = str(Path(model_dir).resolve())
        self.names = names
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        self.max_len = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.lock = threading.Lock()
        self.answered = 0

    # -- requests -----------------------------------------------------------------------------------------

    def check_model(self, body: dict[str, Any]) -> str:
        name = body.get("model")
        if name not in self.names:
            raise BadRequest(f"The model `{name}` does not exist.", 404, "NotFoundError")
        return str(name)

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        name = self.check_model(body)
        prompts = self._prompts(body.get("prompt"))
        echo = bool(body.get("echo", False))
        max_tokens = int(body.get("max_tokens", 16) if body.get("max_tokens") is not None else 16)
        self._check_max_tokens(max_tokens, echo)
        k = body.get("logprobs")
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for index, ids in enumerate(prompts):
            self._fits(ids, max_tokens)
            generated, gen_lps, finish = self._generate(ids, max_tokens, body)
            text = self.tokenizer.decode(generated)
            text, generated, gen_lps, finish = _apply_stop(self.tokenizer, text, generated, gen_lps, finish, body)
            choice: dict[str, Any] = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
            if echo:
                choice["text"] = self.tokenizer.decode(ids) + text
            if k is not None:
                choice["logprobs"] = self._logprobs(ids if echo else [], generated, gen_lps, int(k))
            choices.append(choice)
            prompt_tokens += len(ids)
            completion_tokens += len(generated)
        self.answered += 1
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            **self._response_extra(),
        }

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        name = self.check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list.")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or (self.max_len - len(ids))
        self._fits(ids, int(max_tokens))
        generated, gen_lps, finish = self._generate(ids, int(max_tokens), body)
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        text, generated, _, finish = _apply_stop(self.tokenizer, text, generated, gen_lps, finish, body)
        self.answered += 1
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": len(generated),
                "total_tokens": len(ids) + len(generated),
            },
            **self._response_extra(),
        }

    def _check_max_tokens(self, max_tokens: int, echo: bool) -> None:
        if max_tokens < 0 or (max_tokens == 0 and not echo):
            raise BadRequest("max_tokens must be at least 1, got 0.")

    def _response_extra(self) -> dict[str, Any]:
        """What an engine adds to every completion (an SGLang stand-in's `metadata`); vLLM nothing."""
        return {}

    # -- the model ----------------------------------------------------------------------------------------

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            return [self._encode(prompt)]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return [list(prompt)]
        if isinstance(prompt, list) and prompt:
            out = []
            for item in prompt:
                if isinstance(item, str):
                    out.append(self._encode(item))
                elif isinstance(item, list) and item and all(isinstance(t, int) for t in item):
                    out.append(list(item))
                else:
                    raise BadRequest("prompt must be a string, a list of token ids, or a list of either.")
            return out
        raise BadRequest("prompt must be a string, a list of token ids, or a list of either.")

    def _encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer(text)["input_ids"]]

    def _fits(self, ids: list[int], max_tokens: int) -> None:
        if len(ids) + max_tokens > self.max_len:
            raise BadRequest(
                f"This model's maximum context length is {self.max_len} tokens. However, you requested "
                f"{len(ids) + max_tokens} tokens ({len(ids)} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion."
            )

    def _generate(self, ids: list[int], max_tokens: int, body: dict[str, Any]) -> tuple[list[int], list[Any], str]:
        """Up to `max_tokens` new tokens after `ids`, with each one's log-probabilities over the vocabulary."""
        torch = self.torch
        temperature = float(body.get("temperature") if body.get("temperature") is not None else 1.0)
        top_p = float(body.get("top_p") if body.get("top_p") is not None else 1.0)
        generator = torch.Generator().manual_seed(int(body["seed"])) if body.get("seed") is not None else None
        eos = self.tokenizer.eos_token_id
        out: list[int] = []
        lps: list[Any] = []
        with self.lock, torch.no_grad():
            past = None
            step = torch.tensor([ids])
            for _ in range(max_tokens):
                result = self.model(step, past_key_values=past, use_cache=True)
                past = result.past_key_values
                logits = result.logits[0, -1].float()
                logprobs = torch.log_softmax(logits, dim=-1)
                if temperature == 0:
                    token = int(torch.argmax(logits))
                else:
                    probs = torch.softmax(logits / temperature, dim=-1)
                    if top_p < 1.0:
                        sorted_probs, order = torch.sort(probs, descending=True)
                        keep = torch.cumsum(sorted_probs, 0) - sorted_probs < top_p
                        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
                    token = int(torch.multinomial(probs / probs.sum(), 1, generator=generator))
                out.append(token)
                lps.append(logprobs)
                if token == eos:
                    return out, lps, "stop"
                step = torch.tensor([[token]])
        return out, lps, "length"

    def _prompt_logprobs(self, ids: list[int]) -> list[Any]:
        torch = self.torch
        with self.lock, torch.no_grad():
            logits = self.model(torch.tensor([ids])).logits[0].float()
        return list(torch.log_softmax(logits[:-1], dim=-1))  # position i predicts token i + 1

    def _logprobs(self, prompt: list[int], generated: list[int], gen_lps: list[Any], k: int) -> dict[str, Any]:
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top: list[dict[str, float] | None] = []
        offsets: list[int] = []
        offset = 0

        def add(token: int, dist: Any) -> None:
            nonlocal offset
            piece = self.tokenizer.decode([token])
            tokens.append(piece)
            offsets.append(offset)
            offset += len(piece)
            if dist is None:
                token_logprobs.append(None)
                top.append(None)
                return
            chosen = float(dist[token])
            token_logprobs.append(chosen)
            best = self.torch.topk(dist, max(k, 0)) if k > 0 else None
            entry = {}
            if best is not None:
                for value, index in zip(best.values.tolist(), best.indices.tolist(), strict=True):
                    entry[self.tokenizer.decode([index])] = float(value)
            entry[piece] = chosen  # vLLM lists the chosen token among its top log-probabilities
            top.append(entry)

        if prompt:
            dists = self._prompt_logprobs(prompt)
            add(prompt[0], None)
            for token, dist in zip(prompt[1:], dists, strict=True):
                add(token, dist)
        for token, dist in zip(generated, gen_lps, strict=True):
            add(token, dist)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def _apply_stop(
    tokenizer: Any, text: str, generated: list[int], lps: list[Any], finish: str, body: dict[str, Any]
) -> tuple[str, list[int], list[Any], str]:
    """The text cut before the first stop string (and the tokens that made it), as vLLM's `stop`."""
    stop = body.get("stop") or []
    stops = [stop] if isinstance(stop, str) else list(stop)
    cut = min((i for s in stops if s and (i := text.find(s)) >= 0), default=None)
    if cut is None:
        return text, generated, lps, finish
    kept = 0
    while kept < len(generated) and len(tokenizer.decode(generated[: kept + 1])) <= cut:
        kept += 1
    return text[:cut], generated[:kept], lps[:kept], "stop"


def make_server(engine: Engine, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, exc: BadRequest) -> None:
            self._send(
                exc.status, {"error": {"message": str(exc), "type": exc.kind, "param": None, "code": exc.status}}
            )

        def do_GET(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            if path == "/health":
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif path == "/v1/models":
                data = [
                    {"id": n, "object": "model", "owned_by": "vllm", "root": engine.model_dir,
                     "max_model_len": engine.max_len}
                    for n in engine.names
                ]  # fmt: skip
                self._send(200, {"object": "list", "data": data})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            try:
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                except ValueError as exc:
                    raise BadRequest(f"Invalid JSON body: {exc}") from None
                if not isinstance(body, dict):
                    raise BadRequest("The body must be a JSON object.")
                if path == "/v1/completions":
                    self._send(200, engine.completions(body))
                elif path == "/v1/chat/completions":
                    self._send(200, engine.chat(body))
                else:
                    self._send(404, {"detail": "Not Found"})
                    return
            except BadRequest as exc:
                self._error(exc)
                return
            _log(engine)

    return ThreadingHTTPServer((host, port), Handler)


def _log(engine: Engine) -> None:
    path = os.environ.get("VLLM_STANDIN_LOG")
    if not path:
        return
    try:
        manifest = json.loads((Path(engine.model_dir) / "ckpteval_export.json").read_text())
    except (OSError, ValueError):
        manifest = {}
    record = {"served": engine.model_dir, "identity": manifest.get("identity"), "answered": engine.answered}
    Path(path).write_text(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve")
    serve.add_argument("model")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--served-model-name", nargs="+", default=None)
    serve.add_argument("--tensor-parallel-size", type=int, default=1)
    serve.add_argument("--pipeline-parallel-size", type=int, default=1)
    serve.add_argument("--data-parallel-size", type=int, default=1)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--trust-remote-code", action="store_true")
    args = parser.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        print(f"ValueError: {args.model} is not a Hugging Face model directory (no config.json)", file=sys.stderr)
        return 1
    print(f"INFO: loading {args.model} (stand-in for vLLM: transformers, CPU)", flush=True)
    engine = Engine(args.model, args.served_model_name or [args.model])
    server = make_server(engine, args.port, args.host)
    print(f"INFO: Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
