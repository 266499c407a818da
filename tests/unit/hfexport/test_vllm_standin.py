"""The vLLM stand-in (tests/support/vllm_standin.py) serving the tiny checkpoint's export answers like the builtin
server serving the checkpoint: the same echo + logprobs scores (what lm-eval sums for a log-likelihood task)
and the same greedy tokens, over real HTTP; and it fails as vLLM does. A double that scored differently
would let the Slurm test of vLLM-on-Megatron pass with wrong scores."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy_support import RunningServer, free_port, request_json

STANDIN = Path(__file__).resolve().parents[2] / "support" / "vllm_standin.py"
PROMPT = "The capital of France is Paris, and the capital of Italy is"


@pytest.fixture(scope="module")
def standin(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from ckpteval.hfexport.write import export_checkpoint

    export = export_checkpoint(tiny_checkpoint, tmp_path_factory.mktemp("standin") / "hf")
    port = free_port()
    argv = [sys.executable, str(STANDIN), "serve", str(export.output), "--port", str(port)]
    process = subprocess.Popen([*argv, "--served-model-name", "model", "job-identity"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if request_json("GET", url + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _completion(url: str, model: str, **body: object) -> tuple[int, dict]:
    return request_json("POST", url + "/v1/completions", {"model": model, "prompt": PROMPT, **body})


def test_its_scores_and_greedy_tokens_are_the_builtin_server_s(standin: str, tiny_server: RunningServer) -> None:
    settings = {"max_tokens": 8, "temperature": 0, "echo": True, "logprobs": 1}
    status, ours = _completion(standin, "model", **settings)
    assert status == 200, ours
    status, theirs = tiny_server.post("/v1/completions", {"model": "megatron-model", "prompt": PROMPT, **settings})
    assert status == 200, theirs
    a, b = ours["choices"][0]["logprobs"], theirs["choices"][0]["logprobs"]
    assert a["tokens"] == b["tokens"]  # the prompt's tokens, then the same 8 greedy ones
    assert a["token_logprobs"][0] is None
    diff = max(abs(x - y) for x, y in zip(a["token_logprobs"][1:], b["token_logprobs"][1:], strict=True))
    assert diff < 2e-3, diff
    assert ours["choices"][0]["text"] == theirs["choices"][0]["text"]


def test_it_lists_every_served_name_and_fails_as_vllm_does(standin: str) -> None:
    status, models = request_json("GET", standin + "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["model", "job-identity"]
    status, body = _completion(standin, "other")
    assert status == 404 and body["error"]["message"] == "The model `other` does not exist."
    status, body = _completion(standin, "model", max_tokens=5000)
    assert status == 400 and "maximum context length is 2048 tokens" in body["error"]["message"]
    status, body = request_json("POST", standin + "/v1/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "BadRequestError"
    status, body = request_json(
        "POST", standin + "/v1/chat/completions",
        {"model": "job-identity", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stop": ["\n"]},
    )  # fmt: skip
    assert status == 200 and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] <= 4
