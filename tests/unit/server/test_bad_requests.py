"""Bad requests get an OpenAI error object with a 4xx status, and the server keeps serving."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy_support import RunningServer

LONG = "x" * 3000  # the tiny model's context is 2048 byte tokens

CASES: list[tuple[str, str, Any, int, str, str | None]] = [
    # (id, path, body, status, message fragment, param)
    ("malformed-json", "/v1/completions", b'{"prompt": "x",', 400, "not valid JSON", None),
    ("empty-body", "/v1/completions", b"", 400, "not valid JSON", None),
    ("not-an-object", "/v1/completions", [1, 2], 400, "must be a JSON object", None),
    ("missing-prompt", "/v1/completions", {"max_tokens": 3}, 400, "'prompt' is required", "prompt"),
    ("prompt-wrong-type", "/v1/completions", {"prompt": {"a": 1}}, 400, "'prompt' must be", "prompt"),
    ("empty-prompt", "/v1/completions", {"prompt": ""}, 400, "prompt is empty", "prompt"),
    ("token-outside-vocab", "/v1/completions", {"prompt": [1, 99999]}, 400, "outside the vocabulary", "prompt"),
    (
        "prompt-too-long",
        "/v1/completions",
        {"prompt": LONG, "max_tokens": 1},
        400,
        "maximum context length is 2048",
        "prompt",
    ),
    (
        "scoring-prompt-too-long",
        "/v1/completions",
        {"prompt": LONG, "echo": True, "logprobs": 1, "max_tokens": 0},
        400,
        "maximum context length",
        "prompt",
    ),
    (
        "prompt-plus-tokens-too-long",
        "/v1/completions",
        {"prompt": "x" * 2000, "max_tokens": 100},
        400,
        "2100 tokens",
        "prompt",
    ),
    (
        "max-tokens-negative",
        "/v1/completions",
        {"prompt": "x", "max_tokens": -1},
        400,
        "'max_tokens' must be between 0 and 2048",
        "max_tokens",
    ),
    (
        "max-tokens-huge",
        "/v1/completions",
        {"prompt": "x", "max_tokens": 10**9},
        400,
        "'max_tokens' must be between",
        "max_tokens",
    ),
    (
        "max-tokens-not-int",
        "/v1/completions",
        {"prompt": "x", "max_tokens": "ten"},
        400,
        "'max_tokens' must be an integer",
        "max_tokens",
    ),
    (
        "temperature-negative",
        "/v1/completions",
        {"prompt": "x", "temperature": -1},
        400,
        "'temperature' must be",
        "temperature",
    ),
    ("top-p-zero", "/v1/completions", {"prompt": "x", "top_p": 0}, 400, "'top_p' must be > 0", "top_p"),
    (
        "logprobs-too-many",
        "/v1/completions",
        {"prompt": "x", "logprobs": 50},
        400,
        "'logprobs' must be between 0 and 20",
        "logprobs",
    ),
    ("stop-wrong-type", "/v1/completions", {"prompt": "x", "stop": 3}, 400, "'stop' must be", "stop"),
    ("stream", "/v1/completions", {"prompt": "x", "stream": True}, 400, "Streaming is not supported", "stream"),
    ("unknown-model", "/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "'gpt-4' does not exist", "model"),
    (
        "chat-unknown-model",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "model": "m2"},
        404,
        "does not exist",
        "model",
    ),
    ("chat-missing-messages", "/v1/chat/completions", {"max_tokens": 2}, 400, "'messages' is required", "messages"),
    (
        "chat-bad-message",
        "/v1/chat/completions",
        {"messages": [{"content": "no role"}]},
        400,
        "messages[0] must be",
        "messages",
    ),
    (
        "chat-too-long",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": LONG}]},
        400,
        "maximum context length",
        "messages",
    ),
    ("tokenize-missing-prompt", "/tokenize", {}, 400, "'prompt' must be a string", "prompt"),
    ("detokenize-bad-tokens", "/detokenize", {"tokens": "abc"}, 400, "'tokens' must be a list", "tokens"),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_request(
    tiny_server: RunningServer, path: str, body: Any, status: int, fragment: str, param: str | None
) -> None:
    got_status, payload = tiny_server.post(path, body)
    assert got_status == status
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment in error["message"]
    assert error["param"] == param
    assert error["type"] in ("invalid_request_error", "not_found_error")


def test_unknown_route_and_wrong_method(tiny_server: RunningServer) -> None:
    status, payload = tiny_server.get("/v1/nothing")
    assert status == 404 and "No route /v1/nothing" in payload["error"]["message"]
    status, payload = tiny_server.post("/v1/models", {})
    assert status == 405 and "accepts GET" in payload["error"]["message"]


def test_still_serving_after_bad_requests(tiny_server: RunningServer) -> None:
    for _, path, body, *_ in CASES:
        tiny_server.post(path, body)
    status, health = tiny_server.get("/v1/health")
    assert status == 200 and health["status"] == "healthy" and health["checkpoint"]["content"]["sha256"]
    status, payload = tiny_server.post("/v1/completions", {"prompt": "still here", "max_tokens": 2, "temperature": 0})
    assert status == 200 and payload["choices"][0]["finish_reason"] in ("length", "stop")
    assert tiny_server.process.poll() is None
    assert "Traceback" not in tiny_server.log()
