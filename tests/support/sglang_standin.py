"""A stand-in for SGLang 0.5's OpenAI server, for machines without a GPU: `python3 -m sglang.launch_server` on a
Hugging Face directory, computed by transformers (the vLLM stand-in's engine: tests/support/vllm_standin.py).

    python tests/support/sglang_standin.py --model-path DIR --host H --port P --served-model-name NAME
        [--tp-size=N] [--dp-size=N] [--trust-remote-code] [--mem-fraction-static F] [--weight-version V]

`install(directory)` writes a package `sglang` there whose `launch_server` runs this file: with that directory on
PYTHONPATH, `python -m sglang.launch_server ...` (what `ckpteval.deploy.commands.sglang_command` writes) starts
the stand-in.

What it shares with SGLang 0.5's server (python/sglang/srt/entrypoints/http_server.py, openai/serving_*.py,
managers/tokenizer_manager.py; what ckpteval and the harness rely on):
- the command line above; it loads the model, then listens ("Uvicorn running on ..."), answers a warm-up
  request and says "The server is fired up and ready to roll!"; before that `/health` and `/health_generate`
  are 503 (its `ServerStatus.Starting`), then 200;
- ONE served model name (`--served-model-name`, default the model path), listed by `GET /v1/models` (`id` and
  `root` both the name, `max_model_len`); the `model` of a request is not checked (SGLang answers any name and
  echoes it back); after a load from disk the listed name is the new model path (SGLang sets
  `served_model_name = model_path` when `dp_size` is 1);
- `--weight-version` (default "default"): reported by `GET /get_model_info` (beside `model_path`,
  `tokenizer_path`, `is_generation`, `preferred_sampling_params`) and `GET /get_weight_version`, and in every
  completion's `metadata.weight_version`;
- `POST /v1/completions`: text, token ids or a list of either; `max_tokens` (16 by default, 0 allowed),
  `temperature`, `top_p`, `seed`, `stop`, `echo`; `logprobs` k: `tokens` (each token's text), `token_logprobs`,
  `top_logprobs` (the k best as {text: logprob}, the chosen token not added), `text_offset` all -1 ("not
  supported yet"); with `echo` the prompt's too (`logprob_start_len` 0 through the OpenAI layer, despite its
  "Echo is not compatible with logprobs" warning), the first token's None;
- `POST /v1/chat/completions`: the tokenizer's chat template with the generation prompt;
- `POST /update_weights_from_disk` `{"model_path", "load_format", "abort_all_requests", "weight_version"}`:
  waits for the requests in flight, reads the directory's weights into the model it holds (names and shapes
  must match; weights the directory lacks are left as they were, as SGLang's loader does), drops its cache,
  takes `weight_version` on success; answers `{"success", "message", "num_paused_requests"}`, 200 or 400. A
  failure rolls back to the weights it had ("Rolling back to original weights.") and keeps its version;
- failures as SGLang answers them: 400 `{"object": "error", "message", "type": "BadRequest", "code": 400}` for
  a prompt past the context or a malformed body, `{"detail": "Not Found"}` 404 for other routes; a model path
  that is no Hugging Face directory ends the process with an error before it listens.

It also writes what it serves (the directory's `ckpteval_export.json` identity, its weight version, the count of
completions) to `$SGLANG_STANDIN_LOG` when that is set, so a test can see which model the engine served.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_standin import BadRequest, Engine


class SglangEngine(Engine):
    """The vLLM stand-in's model and tokenizer, with SGLang's answers and its load from disk."""

    def __init__(self, model_dir: str, name: str, weight_version: str) -> None:
        super().__init__(model_dir, [name])
        self.weight_version = weight_version
        self.tokenizer_path = self.model_dir
        self.ready = False

    @property
    def served_name(self) -> str:
        return self.names[0]

    def check_model(self, body: dict[str, Any]) -> str:
        return str(body.get("model") or "default")  # SGLang does not check it

    def _check_max_tokens(self, max_tokens: int, echo: bool) -> None:
        if max_tokens < 0:
            raise BadRequest("max_new_tokens must be at least 0, got " + str(max_tokens))

    def _fits(self, ids: list[int], max_tokens: int) -> None:
        if len(ids) >= self.max_len:
            raise BadRequest(
                f"The input ({len(ids)} tokens) is longer than the model's context length ({self.max_len} tokens)."
            )
        if len(ids) + max_tokens > self.max_len:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {self.max_len} tokens. "
                f"You requested a total of {len(ids) + max_tokens} tokens: {len(ids)} tokens from the input "
                f"messages and {max_tokens} tokens for the completion. Please reduce the number of tokens in the "
                "input messages or the completion to fit within the limit."
            )

    def _response_extra(self) -> dict[str, Any]:
        return {"metadata": {"weight_version": self.weight_version}}

    def _logprobs(self, prompt: list[int], generated: list[int], gen_lps: list[Any], k: int) -> dict[str, Any]:
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top: list[dict[str, float] | None] = []

        def add(token: int, dist: Any) -> None:
            tokens.append(self.tokenizer.decode([token]))
            if dist is None:
                token_logprobs.append(None)
                top.append(None)
                return
            token_logprobs.append(float(dist[token]))
            entry: dict[str, float] = {}
            if k > 0:
                best = self.torch.topk(dist, k)
                for value, index in zip(best.values.tolist(), best.indices.tolist(), strict=True):
                    entry[self.tokenizer.decode([index])] = float(value)
            top.append(entry)

        if prompt:
            dists = self._prompt_logprobs(prompt)
            add(prompt[0], None)
            for token, dist in zip(prompt[1:], dists, strict=True):
                add(token, dist)
        for token, dist in zip(generated, gen_lps, strict=True):
            add(token, dist)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top,
            "text_offset": [-1] * len(tokens),
        }

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_dir,
            "tokenizer_path": self.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
        }

    def update_weights_from_disk(self, body: dict[str, Any]) -> tuple[bool, str]:
        """SGLang's `ModelRunner.update_weights_from_disk` behind its tokenizer manager's writer lock."""
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise BadRequest("model_path: Field required")
        with self.lock:  # the requests in flight finish first; new ones wait
            try:
                weights = _read_weights(Path(path))
            except (OSError, ValueError) as exc:
                return False, f"Failed to get weights iterator: {exc}."
            own = dict(self.model.named_parameters())
            before = {name: p.detach().clone() for name, p in own.items()}
            try:
                with self.torch.no_grad():
                    for name, tensor in weights.items():
                        if name not in own:
                            if name.endswith("rotary_emb.inv_freq") or (
                                name == "lm_head.weight" and self.model.config.tie_word_embeddings
                            ):
                                continue
                            raise KeyError(name)
                        if tuple(own[name].shape) != tuple(tensor.shape):
                            raise AssertionError(
                                f"Attempted to load weight ({tuple(tensor.shape)}) into parameter "
                                f"({tuple(own[name].shape)})"
                            )
                        own[name].copy_(tensor.to(own[name].dtype))
            except (KeyError, AssertionError) as exc:
                with self.torch.no_grad():
                    for name, value in before.items():
                        own[name].copy_(value)
                return False, f"Failed to update weights: {exc!r}.\nRolling back to original weights."
            self.model_dir = str(Path(path).resolve())
            self.names = [path]  # SGLang serves the new path as its model name (dp_size 1)
            if body.get("weight_version") is not None:
                self.weight_version = str(body["weight_version"])
        message = "Succeeded to update model weights."
        if body.get("weight_version") is not None:
            message += f" Weight version updated to {body['weight_version']}."
        return True, message


def _read_weights(directory: Path) -> dict[str, Any]:
    """Every tensor of a Hugging Face directory's safetensors files."""
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"Cannot find any model weights with `{directory}`")
    out: dict[str, Any] = {}
    for file in files:
        out.update(load_file(str(file)))
    return out


def make_server(engine: SglangEngine, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
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

        def _empty(self, status: int) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            if path in ("/health", "/health_generate"):
                self._empty(200 if engine.ready else 503)
            elif path == "/get_model_info":
                self._send(200, engine.model_info())
            elif path == "/get_weight_version":
                self._send(200, {"weight_version": engine.weight_version})
            elif path == "/v1/models":
                card = {"id": engine.served_name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                        "root": engine.served_name, "max_model_len": engine.max_len}  # fmt: skip
                self._send(200, {"object": "list", "data": [card]})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            try:
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                except ValueError as exc:
                    raise BadRequest(f"JSON decode error: {exc}") from None
                if not isinstance(body, dict):
                    raise BadRequest("Input should be a valid dictionary")
                if path == "/v1/completions":
                    self._send(200, engine.completions(body))
                elif path == "/v1/chat/completions":
                    self._send(200, engine.chat(body))
                elif path == "/update_weights_from_disk":
                    success, message = engine.update_weights_from_disk(body)
                    print(f"update_weights_from_disk: {message}", flush=True)
                    self._send(200 if success else 400,
                               {"success": success, "message": message, "num_paused_requests": 0})  # fmt: skip
                else:
                    self._send(404, {"detail": "Not Found"})
                    return
            except BadRequest as exc:
                self._send(400, {"object": "error", "message": str(exc), "type": "BadRequest", "param": None,
                                 "code": 400})  # fmt: skip
                return
            _log(engine)

    return ThreadingHTTPServer((host, port), Handler)


def _log(engine: SglangEngine) -> None:
    path = os.environ.get("SGLANG_STANDIN_LOG")
    if not path:
        return
    try:
        manifest = json.loads((Path(engine.model_dir) / "ckpteval_export.json").read_text())
    except (OSError, ValueError):
        manifest = {}
    record = {
        "served": engine.model_dir,
        "identity": manifest.get("identity"),
        "weight_version": engine.weight_version,
        "answered": engine.answered,
    }
    Path(path).write_text(json.dumps(record) + "\n")


def install(directory: Path) -> Path:
    """A package `sglang` in `directory` whose `launch_server` module runs this stand-in; `directory` returned
    (put it on PYTHONPATH)."""
    package = directory / "sglang"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text('"""Stand-in: tests/support/sglang_standin.py."""\n__version__ = "0.5.2"\n')
    (package / "launch_server.py").write_text(
        "import runpy, sys\n"
        f"sys.argv[0] = {str(Path(__file__).resolve())!r}\n"
        f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')\n"
    )
    return directory


def start(
    model: Path, work: Path, *, weight_version: str, name: str = "model", timeout: float = 300
) -> tuple[Any, str]:
    """For a test: `python -m sglang.launch_server` on `model`, as a job runs it (the stand-in installed as
    `sglang` under `work`), until healthy; (the process, its base URL)."""
    import subprocess

    from tests.deploy_support import free_port
    from tests.support.waiting import wait_until

    shim = install(work / "shim")
    port = free_port()
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", name, "--tp-size=1", "--dp-size=1", "--trust-remote-code",
            "--weight-version", weight_version]  # fmt: skip
    log_path = work / f"sglang-{port}.log"
    env = {**os.environ, "PYTHONPATH": str(shim), "HF_HUB_OFFLINE": "1"}
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    wait_until(healthy, timeout=timeout, what=f"the SGLang stand-in on {model}", interval=0.5,
               unless=lambda: process.poll() is not None, context=log_path.read_text)  # fmt: skip
    return process, url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--dp-size", type=int, default=1)
    parser.add_argument("--mem-fraction-static", type=float, default=None)
    parser.add_argument("--weight-version", default="default")
    parser.add_argument("--trust-remote-code", action="store_true")
    args = parser.parse_args(argv)
    print(f"server_args=ServerArgs(model_path={args.model_path!r}, served_model_name={args.served_model_name!r}, "
          f"tp_size={args.tp_size}, dp_size={args.dp_size}, weight_version={args.weight_version!r}, "
          "device='cpu' (stand-in for SGLang: transformers))", flush=True)  # fmt: skip
    if not (Path(args.model_path) / "config.json").is_file():
        print(f"OSError: {args.model_path} does not appear to have a file named config.json.", file=sys.stderr)
        return 1
    print("Load weight begin.", flush=True)
    engine = SglangEngine(args.model_path, args.served_model_name or args.model_path, args.weight_version)
    print(f"Load weight end. type={type(engine.model).__name__}, dtype=torch.float32", flush=True)
    server = make_server(engine, args.port, args.host)
    print(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)", flush=True)

    def warm_up() -> None:
        engine.completions({"prompt": "The capital city of France is", "max_tokens": 1, "temperature": 0})
        engine.answered = 0
        engine.ready = True
        print("The server is fired up and ready to roll!", flush=True)

    threading.Thread(target=warm_up, daemon=True).start()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
