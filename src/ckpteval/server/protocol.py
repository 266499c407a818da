"""The OpenAI-compatible wire format: request validation and response shapes (no model, no HTTP).

Requests follow OpenAI's legacy completions and chat completions (as vLLM and Export-Deploy
accept them); unknown fields are ignored, wrong ones are a 4xx `ApiError` carrying OpenAI's error
body. Responses carry what lm-eval's `local-completions` parser reads (`tokens`, `token_logprobs`,
`top_logprobs` with a leading None under `echo`, `text_offset`) and what OpenAI clients read.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from ckpteval.server.engine import Generation, SamplingParams, ScoredRow

if TYPE_CHECKING:
    from ckpteval.server.tokenizer import ServedTokenizer

MAX_LOGPROBS = 20
MAX_N = 16
MAX_STOP_SEQUENCES = 64
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 512  # Export-Deploy's default for chat


class ApiError(Exception):
    """A request the server refuses: HTTP `status` and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _int(body: dict[str, Any], name: str, default: int | None, *, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer, not {value!r}.", name)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise _bad(f"'{name}' must be {bound}; got {value}.", name)
    return value


def _float(
    body: dict[str, Any], name: str, default: float, *, low: float, high: float, low_open: bool = False
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"'{name}' must be a number, not {value!r}.", name)
    if value < low or value > high or (low_open and value == low):
        raise _bad(f"'{name}' must be {'>' if low_open else '>='} {low} and <= {high}; got {value}.", name)
    return float(value)


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"'{name}' must be true or false, not {value!r}.", name)
    return value


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _bad("'stop' must be a string or a list of strings.", "stop")
    if len(value) > MAX_STOP_SEQUENCES:
        raise _bad(f"'stop' may hold at most {MAX_STOP_SEQUENCES} sequences.", "stop")
    return tuple(s for s in value if s)


@dataclass(frozen=True)
class CompletionRequest:
    """A validated /v1/completions request with its prompts tokenized."""

    prompts: list[list[int]]
    prompt_texts: list[str]  # what `echo` returns for each prompt
    echo: bool
    logprobs: int | None
    n: int
    params: SamplingParams

    @property
    def is_scoring(self) -> bool:
        """echo + logprobs with at most one greedy token: one scoring forward answers it."""
        p = self.params
        return (
            self.echo
            and self.logprobs is not None
            and p.max_tokens <= 1
            and not p.stop
            and (p.temperature == 0 or p.max_tokens == 0)
        )


@dataclass(frozen=True)
class ChatRequest:
    """A validated /v1/chat/completions request with the conversation rendered and tokenized."""

    prompt: list[int]
    n: int
    logprobs: bool
    params: SamplingParams


class RequestParser:
    """Validates request bodies against the served model (name, vocabulary, context length)."""

    def __init__(
        self, tokenizer: ServedTokenizer, *, served_model_name: str, max_context: int, vocab_size: int
    ) -> None:
        self.tokenizer = tokenizer
        self.served_model_name = served_model_name
        self.max_context = max_context
        self.vocab_size = vocab_size

    def check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.served_model_name:
            raise ApiError(
                404,
                f"The model '{model}' does not exist; this server serves '{self.served_model_name}'.",
                param="model",
                code="model_not_found",
            )

    def _common(
        self,
        body: dict[str, Any],
        *,
        default_max_tokens: int | None,
        longest_prompt: int,
        max_tokens_field: str = "max_tokens",
    ) -> SamplingParams:
        if _bool(body, "stream", False):
            raise _bad('Streaming is not supported by this server; send "stream": false.', "stream")
        room = self.max_context - longest_prompt
        max_tokens = _int(body, max_tokens_field, None, low=0, high=self.max_context)
        if max_tokens is None:
            max_tokens = max(0, min(default_max_tokens or room, room))
        temperature = _float(body, "temperature", 1.0, low=0.0, high=100.0)
        top_k = _int(body, "top_k", 0, low=-1) or 0
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=_float(body, "top_p", 1.0, low=0.0, high=1.0, low_open=True),
            top_k=max(0, top_k),
            seed=_int(body, "seed", None, low=-(2**63), high=2**63 - 1),
            stop=_stop(body),
        )

    def _check_length(self, prompt_len: int, max_tokens: int, *, scoring: bool, param: str) -> None:
        if prompt_len == 0:
            raise _bad("The prompt is empty; it must have at least one token.", param)
        # Scoring needs only the prompt's forward: its last position predicts the one extra token.
        needed = prompt_len if scoring else prompt_len + max_tokens
        if needed > self.max_context:
            raise _bad(
                f"This model's maximum context length is {self.max_context} tokens. However, you requested "
                f"{needed} tokens ({prompt_len} in the prompt, {0 if scoring else max_tokens} in the completion). "
                "Please reduce the length of the prompt or completion.",
                param,
                code="context_length_exceeded",
            )

    def completion(self, body: dict[str, Any]) -> CompletionRequest:
        """Validate a /v1/completions body (`prompt` or Export-Deploy's `prompts`)."""
        self.check_model(body)
        raw = body.get("prompt", body.get("prompts"))
        if raw is None:
            raise _bad("'prompt' is required.", "prompt")
        prompts, texts = self._prompts(raw)
        logprobs = body.get("logprobs")
        if isinstance(logprobs, bool):  # some clients send true/false
            logprobs = 1 if logprobs else None
        else:
            logprobs = _int(body, "logprobs", None, low=0, high=MAX_LOGPROBS)
        echo = _bool(body, "echo", False)
        params = self._common(
            body, default_max_tokens=COMPLETION_DEFAULT_MAX_TOKENS, longest_prompt=max(map(len, prompts))
        )
        params = SamplingParams(**{**params.__dict__, "logprobs": logprobs})
        request = CompletionRequest(
            prompts=prompts,
            prompt_texts=texts,
            echo=echo,
            logprobs=logprobs,
            n=_int(body, "n", 1, low=1, high=MAX_N) or 1,
            params=params,
        )
        for prompt in prompts:
            self._check_length(len(prompt), params.max_tokens, scoring=request.is_scoring, param="prompt")
        return request

    def _prompts(self, raw: Any) -> tuple[list[list[int]], list[str]]:
        if isinstance(raw, str):
            items: list[Any] = [raw]
        elif isinstance(raw, list) and raw and _all_ints(raw):
            items = [raw]  # one prompt given as token ids
        elif isinstance(raw, list) and raw:
            items = raw
        else:
            raise _bad(
                "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists.", "prompt"
            )
        prompts, texts = [], []
        for item in items:
            if isinstance(item, str):
                prompts.append(self.tokenizer.encode(item))
                texts.append(item)
            elif isinstance(item, list) and _all_ints(item):
                if item and (min(item) < 0 or max(item) >= self.vocab_size):
                    bad = next(t for t in item if not 0 <= t < self.vocab_size)
                    raise _bad(f"Token id {bad} is outside the vocabulary (0..{self.vocab_size - 1}).", "prompt")
                prompts.append(list(item))
                texts.append(self.tokenizer.decode(item, skip_special_tokens=False))
            else:
                raise _bad("Each prompt must be a string or a list of token ids.", "prompt")
        return prompts, texts

    def chat(self, body: dict[str, Any]) -> ChatRequest:
        """Validate a /v1/chat/completions body and render its messages with the chat template."""
        self.check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' is required: a non-empty list of {role, content} objects.", "messages")
        conversation = [self._message(m, i) for i, m in enumerate(messages)]
        if self.tokenizer.chat_template is None:
            raise _bad("The served checkpoint's tokenizer has no chat template; use /v1/completions.", "messages")
        try:
            text = self.tokenizer.render_chat(conversation)
        except Exception as exc:  # jinja raises many types for a template that rejects the input
            raise _bad(f"The chat template rejected the messages: {exc}", "messages") from None
        prompt = self.tokenizer.encode(text, add_special_tokens=False)
        field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        params = self._common(
            body, default_max_tokens=CHAT_DEFAULT_MAX_TOKENS, longest_prompt=len(prompt), max_tokens_field=field
        )
        logprobs = _bool(body, "logprobs", False)
        top = _int(body, "top_logprobs", 0, low=0, high=MAX_LOGPROBS) or 0
        params = SamplingParams(**{**params.__dict__, "logprobs": top if logprobs else None})
        self._check_length(len(prompt), params.max_tokens, scoring=False, param="messages")
        return ChatRequest(
            prompt=prompt, n=_int(body, "n", 1, low=1, high=MAX_N) or 1, logprobs=logprobs, params=params
        )

    @staticmethod
    def _message(message: Any, index: int) -> dict[str, str]:
        where = f"messages[{index}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(f"{where} must be an object with a string 'role'.", "messages")
        content = message.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):  # OpenAI content parts: keep the text ones
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
            ):
                raise _bad(f"{where}.content may only hold text parts.", "messages")
            content = "".join(p["text"] for p in content)
        elif not isinstance(content, str):
            raise _bad(f"{where}.content must be a string or a list of text parts.", "messages")
        return {"role": message["role"], "content": content}


@dataclass
class CompletionChoice:
    """One choice of a completion, with the token counts usage needs."""

    body: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int


def _all_ints(values: list[Any]) -> bool:
    # type() rather than isinstance(): JSON true/false are bools, which are ints to isinstance
    return all(type(v) is int for v in values)


def _top_dicts(pieces: list[str], ids: list[list[int]], values: list[list[float]]) -> list[dict[str, float]]:
    if ids and len(ids[0]) == 1:  # logprobs=1, what lm-eval asks for: skip the inner zip
        return [{pieces[i[0]]: v[0]} for i, v in zip(ids, values, strict=True)]
    return [{pieces[t]: v for t, v in zip(i, vs, strict=True)} for i, vs in zip(ids, values, strict=True)]


def _offsets(pieces: list[str], start: int) -> list[int]:
    return list(accumulate((len(p) for p in pieces[:-1]), initial=start)) if pieces else []


def scoring_choice(
    request: CompletionRequest, index: int, scored: ScoredRow, tokenizer: ServedTokenizer
) -> CompletionChoice:
    """The choice for an echo + logprobs request answered by one scoring forward.

    With max_tokens=1 the greedy next token is appended (lm-eval drops that last entry).
    """
    pieces = tokenizer.pieces
    prompt_index = index // request.n
    prompt = request.prompts[prompt_index]
    tokens = [pieces[t] for t in prompt]
    token_logprobs: list[float | None] = [None, *scored.token_logprobs]
    top: list[dict[str, float] | None] = [None]
    top.extend(_top_dicts(pieces, scored.top_ids[:-1], scored.top_logprobs[:-1]))
    text = request.prompt_texts[prompt_index]
    finish = "length"
    generated = 0
    if request.params.max_tokens == 1:
        token, value = scored.top_ids[-1][0], scored.top_logprobs[-1][0]
        tokens.append(pieces[token])
        token_logprobs.append(value)
        top.extend(_top_dicts(pieces, scored.top_ids[-1:], scored.top_logprobs[-1:]))
        generated = 1
        if token in tokenizer.stop_token_ids:
            finish = "stop"
        else:
            text += tokenizer.decode([token])
    logprobs = {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": _offsets(tokens, 0),
    }
    body = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
    return CompletionChoice(body, len(prompt), generated)


def generation_choice(
    request: CompletionRequest,
    index: int,
    generation: Generation,
    prompt_scores: ScoredRow | None,
    tokenizer: ServedTokenizer,
) -> CompletionChoice:
    """The choice for a completion that generated tokens (with the prompt's scores under echo)."""
    pieces = tokenizer.pieces
    prompt_index = index // request.n
    prompt = request.prompts[prompt_index]
    prefix = request.prompt_texts[prompt_index] if request.echo else ""
    logprobs = None
    if request.logprobs is not None:
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top: list[dict[str, float] | None] = []
        if request.echo and prompt_scores is not None:
            tokens = [pieces[t] for t in prompt]
            token_logprobs = [None, *prompt_scores.token_logprobs]
            top = [None]
            top.extend(_top_dicts(pieces, prompt_scores.top_ids[:-1], prompt_scores.top_logprobs[:-1]))
        tokens.extend(pieces[t] for t in generation.token_ids)
        token_logprobs.extend(generation.token_logprobs or [])
        top.extend({pieces[t]: v for t, v in alternatives} for alternatives in (generation.top or []))
        logprobs = {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top,
            "text_offset": _offsets(tokens, 0),
        }
    body = {
        "index": index,
        "text": prefix + generation.text,
        "logprobs": logprobs,
        "finish_reason": generation.finish_reason,
    }
    return CompletionChoice(body, len(prompt), generation.num_generated)


def completion_response(model: str, choices: list[CompletionChoice], *, n: int) -> dict[str, Any]:
    """The /v1/completions response body."""
    prompt_tokens = sum(c.prompt_tokens for c in choices[::n])
    completion_tokens = sum(c.completion_tokens for c in choices)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [c.body for c in choices],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _chat_logprobs(generation: Generation, tokenizer: ServedTokenizer, top_n: int) -> dict[str, Any]:
    pieces = tokenizer.pieces
    content = []
    for token, value, alternatives in zip(
        generation.token_ids, generation.token_logprobs or [], generation.top or [], strict=True
    ):
        content.append(
            {
                "token": pieces[token],
                "logprob": value,
                "bytes": list(pieces[token].encode()),
                "top_logprobs": [
                    {"token": pieces[t], "logprob": v, "bytes": list(pieces[t].encode())}
                    for t, v in alternatives[:top_n]
                ],
            }
        )
    return {"content": content}


def chat_response(
    model: str, request: ChatRequest, generations: list[Generation], tokenizer: ServedTokenizer
) -> dict[str, Any]:
    """The /v1/chat/completions response body."""
    choices = []
    for i, generation in enumerate(generations):
        logprobs = _chat_logprobs(generation, tokenizer, request.params.logprobs or 0) if request.logprobs else None
        choices.append(
            {
                "index": i,
                "message": {"role": "assistant", "content": generation.text},
                "logprobs": logprobs,
                "finish_reason": generation.finish_reason,
            }
        )
    completion_tokens = sum(g.num_generated for g in generations)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(request.prompt),
            "completion_tokens": completion_tokens,
            "total_tokens": len(request.prompt) + completion_tokens,
        },
    }
