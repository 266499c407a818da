"""Does the endpoint answer each request with that request's own settings, when requests arrive together?

The job runs this once, before any task's first request, when tasks whose requests carry different
settings would otherwise run side by side (`ckpteval.job.request_groups`). It sends a few requests with
different settings, first each alone, then all at once in several orders, and compares every answer sent
beside the others with the same request's answer alone:

- a log-likelihood request (echo + logprobs + max_tokens 1, temperature 0: what lm-eval sends to score);
- greedy generations of one prompt with max_tokens 1, with max_tokens 8, and with max_tokens 8 and a stop
  word taken from the alone answer (so an endpoint that honours it cuts the text there);
- on a chat route, the same generations as chat messages.

An endpoint that batches and applies one request's settings to the batch (Export-Deploy 0.5+: the first
request's) answers differently: log-probabilities missing or added, the prompt echoed, more or fewer tokens,
a stop word ignored or applied. What is compared: echo, log-probabilities (present, how many), the finish
reason and the completion's token count (the text itself when the endpoint reports no token counts), so
that a GPU's batch-dependent rounding of a log-probability is not taken for mixing.

Verdicts (the last line printed; `--out` gets the details as JSON): `honoured: ...`, `mixed: ...` and
`unknown: ...` (the probe could not tell, e.g. a request failed beside the others but not alone). The job
groups the tasks on anything but `honoured`. Standard library only: the job runs it with any python3, on a
cluster's node too (it is shipped in the hook directory).

    python3 ckpteval_settings_probe.py --completions URL [--chat URL] --model ID [--api-key-env NAME] --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

TIMEOUT_S = 120.0
STAGGER_S = 0.003  # requests of a round leave in order, a few ms apart (which one arrives first matters)
ROUNDS = 4
_SCORE_PROMPT = "The capital of France is Paris. The capital of Italy is"
_GENERATE_PROMPT = "Once upon a time, in a small village by the sea, there"
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # like the harness: no HTTP proxy


@dataclass(frozen=True)
class ProbeRequest:
    """One request of the probe: where it goes and its body."""

    name: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Shape:
    """What the settings decide about an answer (the text only when the endpoint counts no tokens)."""

    echo: bool
    logprobs: int | None  # how many token log-probabilities; None: none returned
    finish_reason: str | None
    completion_tokens: int | None
    text: str | None

    def differences(self, alone: Shape) -> list[str]:
        """In words, where this answer differs from the answer to the same request alone."""
        out = []
        if self.echo != alone.echo:
            out.append("the prompt echoed" if self.echo else "the prompt not echoed")
        if self.logprobs != alone.logprobs:
            out.append(f"{self.logprobs or 'no'} log-probabilities (alone: {alone.logprobs or 'none'})")
        if self.finish_reason != alone.finish_reason:
            out.append(f"finish_reason {self.finish_reason!r} (alone: {alone.finish_reason!r})")
        if self.completion_tokens != alone.completion_tokens:
            out.append(f"{self.completion_tokens} completion tokens (alone: {alone.completion_tokens})")
        if self.text != alone.text:
            out.append(f"the text {self.text!r} (alone: {alone.text!r})")
        return out


@dataclass
class Verdict:
    """The probe's answer: `honoured`, `mixed` or `unknown`, why, and what it saw."""

    verdict: str
    reason: str
    seconds: float = 0.0
    differences: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)

    def line(self) -> str:
        return f"{self.verdict}: {self.reason}"


def _post(url: str, body: dict[str, Any], headers: dict[str, str], timeout: float) -> dict[str, Any]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json", **headers}
    )
    with _direct.open(request, timeout=timeout) as response:
        return json.loads(response.read())


def shape(request: ProbeRequest, answer: dict[str, Any]) -> Shape:
    """The settings-dependent parts of `answer` (a completions or chat response with one choice)."""
    choice = (answer.get("choices") or [{}])[0]
    usage = answer.get("usage") or {}
    tokens = usage.get("completion_tokens")
    if "messages" in request.body:
        text = str((choice.get("message") or {}).get("content") or "")
        echo = False
    else:
        text = str(choice.get("text") or "")
        echo = text.startswith(str(request.body["prompt"]))
    logprobs = choice.get("logprobs")
    count = None
    if isinstance(logprobs, dict):
        values = logprobs.get("token_logprobs")
        if values is None and isinstance(logprobs.get("content"), list):  # chat
            values = logprobs["content"]
        count = len(values) if isinstance(values, list) else None
    return Shape(
        echo=echo,
        logprobs=count,
        finish_reason=choice.get("finish_reason"),
        completion_tokens=tokens if isinstance(tokens, int) else None,
        text=None if isinstance(tokens, int) else text,
    )


def _generations(name: str, url: str, base: dict[str, Any], model: str) -> list[ProbeRequest]:
    return [
        ProbeRequest(f"{name} max_tokens=1", url, {**base, "model": model, "max_tokens": 1, "temperature": 0}),
        ProbeRequest(f"{name} max_tokens=8", url, {**base, "model": model, "max_tokens": 8, "temperature": 0}),
    ]


def _with_stop(request: ProbeRequest, alone: Shape, raw: dict[str, Any]) -> ProbeRequest | None:
    """The max_tokens=8 generation with a stop word from the middle of its alone answer (None: too short)."""
    choice = (raw.get("choices") or [{}])[0]
    text = str(choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content") or "")
    if "prompt" in request.body and alone.echo:
        text = text[len(str(request.body["prompt"])) :]
    for start in range(max(1, len(text) // 2), len(text)):
        stop = text[start : start + 2].strip()
        if stop and text.find(stop) >= 1:
            return ProbeRequest(request.name + " stop", request.url, {**request.body, "stop": [stop]})
    return None


def _concurrently(requests: list[ProbeRequest], headers: dict[str, str], timeout: float) -> list[Any]:
    """Send `requests` at once (in order, `STAGGER_S` apart); each answer, or the exception it raised."""
    answers: list[Any] = [None] * len(requests)

    def send(i: int) -> None:
        try:
            answers[i] = _post(requests[i].url, requests[i].body, headers, timeout)
        except (OSError, ValueError) as exc:
            answers[i] = exc

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(len(requests))]
    for thread in threads:
        thread.start()
        time.sleep(STAGGER_S)
    for thread in threads:
        thread.join(timeout + 5)
    return answers


def _failure(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        try:
            detail = exc.read().decode(errors="replace")[:200]
        except OSError:
            detail = ""
        return f"HTTP {exc.code} {detail}".strip()
    return f"{type(exc).__name__}: {exc}"


def probe(
    urls: dict[str, str], model: str, *, headers: dict[str, str] | None = None, timeout: float = TIMEOUT_S
) -> Verdict:
    """Probe the endpoint at `urls` (`completions` and/or `chat` routes) serving `model`."""
    headers = headers or {}
    start = time.monotonic()
    candidates: list[ProbeRequest] = []
    if "completions" in urls:
        url = urls["completions"]
        candidates.append(
            ProbeRequest(
                "log-likelihood",
                url,
                {
                    "model": model,
                    "prompt": _SCORE_PROMPT,
                    "echo": True,
                    "logprobs": 1,
                    "max_tokens": 1,
                    "temperature": 0,
                },
            )
        )
        candidates += _generations("generation", url, {"prompt": _GENERATE_PROMPT}, model)
    if "chat" in urls:
        messages = [{"role": "user", "content": _GENERATE_PROMPT}]
        candidates += _generations("chat", urls["chat"], {"messages": messages}, model)

    requests: list[ProbeRequest] = []
    alone: dict[str, Shape] = {}
    left_out: list[str] = []
    for request in candidates:
        try:
            raw = _post(request.url, request.body, headers, timeout)
        except (OSError, ValueError) as exc:
            left_out.append(f"{request.name}: fails even alone ({_failure(exc)})")
            continue
        requests.append(request)
        alone[request.name] = shape(request, raw)
        if request.body.get("max_tokens") == 8:
            stopped = _with_stop(request, alone[request.name], raw)
            if stopped is None:
                left_out.append(f"{request.name} with a stop word: its answer is too short to take one from")
                continue
            try:
                alone[stopped.name] = shape(stopped, _post(stopped.url, stopped.body, headers, timeout))
                requests.append(stopped)
            except (OSError, ValueError) as exc:
                left_out.append(f"{stopped.name}: fails even alone ({_failure(exc)})")
    if len(requests) < 2:
        return Verdict(
            "unknown", "fewer than two probe requests are answered alone", time.monotonic() - start, [], left_out
        )

    differences: list[str] = []
    failures: list[str] = []
    for round_ in range(ROUNDS):
        k = round_ // 2
        order = requests[k:] + requests[:k]
        order = order[::-1] if round_ % 2 else order
        for request, answer in zip(order, _concurrently(order, headers, timeout), strict=True):
            if isinstance(answer, BaseException) or answer is None:
                failures.append(f"{request.name}: failed beside others ({_failure(answer) if answer else 'no answer'})")
                continue
            diff = shape(request, answer).differences(alone[request.name])
            if diff:
                first = order[0].name
                differences.append(f"{request.name} sent after {first}: {'; '.join(diff)}")
    seconds = time.monotonic() - start
    names = ", ".join(r.name for r in requests)
    if differences:
        return Verdict(
            "mixed",
            f"{len(differences)} of {ROUNDS * len(requests)} answers to concurrent requests differ from the same "
            f"request sent alone, e.g. {differences[0]}",
            seconds,
            differences,
            left_out,
        )
    if failures:
        return Verdict(
            "unknown", f"{len(failures)} concurrent requests failed, e.g. {failures[0]}", seconds, failures, left_out
        )
    return Verdict(
        "honoured",
        f"{ROUNDS} rounds of concurrent requests ({names}) each answered as when sent alone",
        seconds,
        [],
        left_out,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Probe whether an endpoint honours each request's own settings.")
    parser.add_argument("--completions", help="the completions URL")
    parser.add_argument("--chat", help="the chat completions URL")
    parser.add_argument("--model", required=True, help="the model id the requests name")
    parser.add_argument("--api-key-env", help="the environment variable holding the API key")
    parser.add_argument("--out", help="write the verdict and details here (JSON)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per request")
    args = parser.parse_args(argv)
    urls = {k: v for k, v in (("completions", args.completions), ("chat", args.chat)) if v}
    if not urls:
        parser.error("give --completions or --chat")
    key = os.environ.get(args.api_key_env or "", "")
    verdict = probe(urls, args.model, headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=args.timeout)
    if args.out:
        tmp = f"{args.out}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(asdict(verdict), fh, indent=1)
        os.replace(tmp, args.out)
    for line in verdict.left_out + verdict.differences[:8]:
        print(f"  {line}", file=sys.stderr)
    print(verdict.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
