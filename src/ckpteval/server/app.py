"""The HTTP side of the server: a small ASGI app with the routes of Export-Deploy's deployment.

A plain ASGI callable rather than a web framework: the routes are few, and per-request overhead
decides loglikelihood throughput for small models (uvicorn with httptools + uvloop, orjson).
Every route answers with and without a trailing slash. Errors are OpenAI error objects with a
4xx status; an unexpected failure is a 500 of the same shape, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

import ckpteval.routes as routes
from ckpteval.server.engine import Generation, ScoredRow
from ckpteval.server.identity import identity_headers, identity_payload
from ckpteval.server.protocol import (
    ApiError,
    CompletionChoice,
    RequestParser,
    chat_response,
    completion_response,
    generation_choice,
    scoring_choice,
)
from ckpteval.server.scheduler import GenerateJob, Scheduler, ScoreJob
from ckpteval.server.tokenizer import ServedTokenizer

log = logging.getLogger("ckpteval.deploy")

MAX_BODY_BYTES = 64 * 1024 * 1024
_JSON_HEADERS = [(b"content-type", b"application/json")]

Handler = Callable[[Any], Awaitable[Any]]


class OpenAIServer:
    """The request handlers, bound to one scheduler and tokenizer."""

    def __init__(
        self,
        scheduler: Scheduler,
        tokenizer: ServedTokenizer,
        *,
        served_model_name: str,
        max_context: int,
        vocab_size: int,
        identity: str | None = None,
        checkpoint: dict[str, Any] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.identity = identity  # the job's token for this deployment (see `server.serve`)
        self.checkpoint = checkpoint  # what it loaded (`server.loaded.LoadedReport.to_json`)
        self.tokenizer = tokenizer
        self.model_name = served_model_name
        self.max_context = max_context
        self.parser = RequestParser(
            tokenizer, served_model_name=served_model_name, max_context=max_context, vocab_size=vocab_size
        )
        self.created = int(time.time())

    def _score(self, tokens: list[int], top_k: int) -> asyncio.Future[ScoredRow]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ScoredRow] = loop.create_future()
        self.scheduler.submit(ScoreJob(tokens=tokens, top_k=max(1, top_k), future=future, loop=loop))
        return future

    def _generate(self, prompt: list[int], params: Any) -> asyncio.Future[Generation]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Generation] = loop.create_future()
        self.scheduler.submit(GenerateJob(prompt=prompt, params=params, future=future, loop=loop))
        return future

    async def completions(self, body: Any) -> dict[str, Any]:
        request = self.parser.completion(_object(body))
        indices = range(len(request.prompts) * request.n)
        prompts = [request.prompts[i // request.n] for i in indices]
        top_k = request.logprobs or 1
        choices: list[CompletionChoice]
        if request.is_scoring:
            if len(prompts) == 1:  # lm-eval's usual request: skip gather's bookkeeping
                scored = [await self._score(prompts[0], top_k)]
            else:
                scored = list(await asyncio.gather(*(self._score(p, top_k) for p in prompts)))
            choices = [scoring_choice(request, i, s, self.tokenizer) for i, s in zip(indices, scored, strict=True)]
        else:
            generations = asyncio.gather(*(self._generate(p, request.params) for p in prompts))
            wants_scores = request.echo and request.logprobs is not None
            scores = asyncio.gather(*(self._score(p, top_k) for p in prompts)) if wants_scores else None
            generated = await generations
            prompt_scores = await scores if scores is not None else [None] * len(prompts)
            choices = [
                generation_choice(request, i, g, s, self.tokenizer)
                for i, g, s in zip(indices, generated, prompt_scores, strict=True)
            ]
        return completion_response(self.model_name, choices, n=request.n)

    async def chat(self, body: Any) -> dict[str, Any]:
        request = self.parser.chat(_object(body))
        generations = await asyncio.gather(*(self._generate(request.prompt, request.params) for _ in range(request.n)))
        return chat_response(self.model_name, request, list(generations), self.tokenizer)

    async def models(self, _: Any) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "ckpteval",
                    "max_model_len": self.max_context,
                    **identity_payload(self.identity),
                }
            ],
        }

    async def health(self, _: Any) -> dict[str, Any]:
        return {"status": "healthy", **identity_payload(self.identity, self.checkpoint)}

    async def stats(self, _: Any) -> dict[str, Any]:
        counters = self.scheduler.stats.as_dict()
        scorer = self.scheduler.runner.prefix_scorer
        if scorer is not None:
            cache = scorer.cache
            counters["prefix_cache_budget_bytes"] = cache.budget_bytes
            counters["prefix_cache_bytes"] = cache.stats.cache_bytes
            counters["prefix_cache_peak_bytes"] = cache.stats.peak_cache_bytes
            counters["prefix_cache_evicted_tokens"] = cache.stats.evicted_tokens
        return counters

    async def tokenizer_info(self, _: Any) -> dict[str, Any]:
        return {**self.tokenizer.info(), "model_max_length": self.max_context}

    async def tokenize(self, body: Any) -> dict[str, Any]:
        body = _object(body)
        self.parser.check_model(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ApiError(400, "'prompt' must be a string.", param="prompt")
        add_special = body.get("add_special_tokens", True)
        if not isinstance(add_special, bool):
            raise ApiError(400, "'add_special_tokens' must be true or false.", param="add_special_tokens")
        tokens = self.tokenizer.encode(prompt, add_special_tokens=add_special)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": self.max_context}

    async def detokenize(self, body: Any) -> dict[str, Any]:
        body = _object(body)
        self.parser.check_model(body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ApiError(400, "'tokens' must be a list of token ids.", param="tokens")
        return {"prompt": self.tokenizer.decode(tokens, skip_special_tokens=False)}

    def routes(self) -> dict[str, dict[str, Handler]]:
        """Path (without trailing slash) -> method -> handler."""
        return {
            routes.COMPLETIONS: {"POST": self.completions},
            routes.CHAT: {"POST": self.chat},
            routes.MODELS: {"GET": self.models},
            routes.HEALTH: {"GET": self.health},
            "/health": {"GET": self.health},
            routes.STATS: {"GET": self.stats},
            "/tokenizer_info": {"GET": self.tokenizer_info},
            "/tokenize": {"POST": self.tokenize},
            "/detokenize": {"POST": self.detokenize},
        }


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    return body


class _Disconnected(Exception):
    pass


class ServingGate:
    """Whether the model serves now, and the requests it is answering (what a load in place drains).

    `serving`: requests pass; `loading` (another checkpoint is being loaded into the model) and `failed` (a load
    failed: the model holds no checkpoint whole) answer 503 and name no checkpoint. `close()` stops new requests,
    `drained()` waits until those already in have been answered."""

    def __init__(self) -> None:
        self.state = "serving"  # serving | loading | failed
        self.error = ""
        self._in_flight = 0
        self._idle: asyncio.Event | None = None

    def enter(self) -> bool:
        """Let a request in (False: the model does not serve now)."""
        if self.state != "serving":
            return False
        self._in_flight += 1
        return True

    def leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._idle is not None:
            self._idle.set()

    def close(self) -> None:
        self.state = "loading"

    async def drained(self) -> None:
        """Return once every request let in has been answered."""
        while self._in_flight:
            self._idle = asyncio.Event()
            await self._idle.wait()
        self._idle = None

    def unavailable(self) -> tuple[int, Any]:
        """The 503 a request gets while the model does not serve."""
        if self.state == "failed":
            message = f"No checkpoint is served: loading one failed ({self.error})."
        else:
            message = "The server is loading another checkpoint; try again once /v1/health says healthy."
        body = ApiError(503, message, type="service_unavailable", code=503).body()
        return 503, {"status": self.state, **body}


# what answers whatever the gate says: the load itself and the counters
_UNGATED = (routes.STATS,)
AdminHandler = Callable[[dict[str, Any], Any], Awaitable[tuple[int, Any]]]


class AsgiApp:
    """ASGI entry point: routing, JSON in and out, error bodies."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server
        self.routes = server.routes()
        self.gate = ServingGate()
        self.admin: dict[str, AdminHandler] = {}  # path -> handler(scope, body): POST only, never gated
        self.name_answers()

    def name_answers(self) -> None:
        """Every response names the deployment and the checkpoint content it answers with (the server's now)."""
        content = (self.server.checkpoint or {}).get("content") or {}
        self.headers = [*_JSON_HEADERS, *identity_headers(self.server.identity, content.get("sha256"))]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"].rstrip("/") or "/"
        if path in self.admin or path in _UNGATED:
            status, payload = await self._handle(scope, receive)
            await self._send(send, status, payload, self.headers)
        elif not self.gate.enter():
            await self._send(send, *self.gate.unavailable(), _JSON_HEADERS)
        else:
            try:
                headers = self.headers  # the identity this answer is computed with, whatever a load does next
                status, payload = await self._handle(scope, receive)
                await self._send(send, status, payload, headers)
            finally:
                self.gate.leave()

    @staticmethod
    async def _send(send: Any, status: int, payload: Any, headers: list[tuple[bytes, bytes]]) -> None:
        data = orjson.dumps(payload)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*headers, (b"content-length", str(len(data)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": data})

    async def _handle(self, scope: dict[str, Any], receive: Any) -> tuple[int, Any]:
        path = scope["path"].rstrip("/") or "/"
        admin = self.admin.get(path)
        if admin is not None:
            return await self._handle_admin(admin, scope, receive)
        methods = self.routes.get(path)
        try:
            if methods is None:
                raise ApiError(404, f"No route {scope['path']}.", type="not_found_error", code=404)
            handler = methods.get(scope["method"])
            if handler is None:
                raise ApiError(405, f"{scope['path']} accepts {', '.join(methods)}, not {scope['method']}.", code=405)
            body = None
            if scope["method"] == "POST":
                raw = await _read_body(scope, receive)
                try:
                    body = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise ApiError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
            return 200, await handler(body)
        except ApiError as exc:
            return exc.status, exc.body()
        except _Disconnected:
            return 499, {}
        except Exception as exc:  # the HTTP boundary: log it, answer 500, keep serving
            log.exception("request to %s failed", scope["path"])
            return 500, ApiError(500, f"Internal error: {type(exc).__name__}: {exc}", type="server_error").body()

    async def _handle_admin(self, handler: AdminHandler, scope: dict[str, Any], receive: Any) -> tuple[int, Any]:
        try:
            if scope["method"] != "POST":
                raise ApiError(405, f"{scope['path']} accepts POST, not {scope['method']}.", code=405)
            raw = await _read_body(scope, receive)
            try:
                body = orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError as exc:
                raise ApiError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
            return await handler(scope, body)
        except ApiError as exc:
            return exc.status, exc.body()
        except _Disconnected:
            return 499, {}
        except Exception as exc:  # the HTTP boundary, as for every route: log it, answer 500, keep serving
            log.exception("request to %s failed", scope["path"])
            return 500, ApiError(500, f"Internal error: {type(exc).__name__}: {exc}", type="server_error").body()

    @staticmethod
    async def _lifespan(receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _read_body(scope: dict[str, Any], receive: Any) -> bytes:
    for name, value in scope.get("headers", ()):
        if name == b"content-length" and value.isdigit() and int(value) > MAX_BODY_BYTES:
            raise ApiError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.", code=413)
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.", code=413)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks) if len(chunks) != 1 else chunks[0]
