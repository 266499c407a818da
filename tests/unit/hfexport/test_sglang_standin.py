"""The SGLang stand-in (tests/support/sglang_standin.py) serving the tiny checkpoint's export answers like the builtin
server serving the checkpoint: the same echo + logprobs scores (SGLang's OpenAI completions return the prompt's
log-probabilities with `echo`: `logprob_start_len` 0) and the same greedy tokens, over real HTTP; it reports the
job's identity as SGLang does (its weight version) and fails as SGLang does. A double that scored differently
would let the SGLang tests pass with wrong scores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy_support import RunningServer, request_json
from tests.support.sglang_standin import start

PROMPT = "The capital of France is Paris, and the capital of Italy is"


@pytest.fixture(scope="module")
def standin(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from ckpteval.hfexport.write import export_checkpoint

    root = tmp_path_factory.mktemp("sglang-standin")
    export = export_checkpoint(tiny_checkpoint, root / "hf")
    process, url = start(export.output, root, weight_version="job-identity")
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_its_scores_and_greedy_tokens_are_the_builtin_server_s(standin: str, tiny_server: RunningServer) -> None:
    settings = {"max_tokens": 8, "temperature": 0, "echo": True, "logprobs": 1}
    status, ours = request_json("POST", standin + "/v1/completions", {"model": "model", "prompt": PROMPT, **settings})
    assert status == 200, ours
    status, theirs = tiny_server.post("/v1/completions", {"model": "megatron-model", "prompt": PROMPT, **settings})
    assert status == 200, theirs
    a, b = ours["choices"][0]["logprobs"], theirs["choices"][0]["logprobs"]
    n_prompt = ours["usage"]["prompt_tokens"]
    assert (n_prompt, ours["usage"]["completion_tokens"]) == (theirs["usage"]["prompt_tokens"], 8)
    assert len(a["token_logprobs"]) == len(b["token_logprobs"]) == n_prompt + 8
    assert a["token_logprobs"][0] is None and a["top_logprobs"][0] is None
    assert a["text_offset"] == [-1] * (n_prompt + 8)  # SGLang: "not supported yet"
    # what lm-eval reads: each position's log-probability, and whether it is the greedy one (top-1)
    diff = max(abs(x - y) for x, y in zip(a["token_logprobs"][1:], b["token_logprobs"][1:], strict=True))
    assert diff < 2e-3, diff
    greedy = [lp == max(top.values()) for lp, top in zip(a["token_logprobs"][1:], a["top_logprobs"][1:], strict=True)]
    assert all(greedy[n_prompt - 1 :])  # the continuation is greedy
    assert ours["metadata"] == {"weight_version": "job-identity"}


def test_it_reports_its_weight_version_serves_one_name_and_fails_as_sglang_does(standin: str) -> None:
    status, info = request_json("GET", standin + "/get_model_info")
    assert status == 200 and info["weight_version"] == "job-identity" and info["is_generation"] is True
    assert request_json("GET", standin + "/get_weight_version")[1] == {"weight_version": "job-identity"}
    status, models = request_json("GET", standin + "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["model"]
    # SGLang does not check the model name: any is answered, and echoed back
    status, body = request_json(
        "POST", standin + "/v1/completions", {"model": "other", "prompt": "ab", "max_tokens": 2}
    )
    assert status == 200 and body["model"] == "other"
    status, body = request_json(
        "POST", standin + "/v1/completions", {"model": "model", "prompt": PROMPT, "max_tokens": 5000}
    )
    assert status == 400 and body["object"] == "error" and "maximum context length of 2048 tokens" in body["message"]
    status, body = request_json("POST", standin + "/v1/completions", b"{not json")
    assert status == 400 and body["type"] == "BadRequest"
    status, body = request_json(
        "POST", standin + "/v1/chat/completions",
        {"model": "model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )  # fmt: skip
    assert status == 200 and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] <= 4 and body["metadata"]["weight_version"] == "job-identity"
    assert request_json("GET", standin + "/v1/health")[0] == 404  # not the builtin's route
