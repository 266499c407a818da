"""The eval delegate's wire format: slime's `POST /evaluate` request, validated, and its response metrics.

Request (what slime's delegate client sends; `defaults` fill a benchmark's unset fields):

    {"rollout_id": 5, "router_url": "http://10.0.0.1:30000",
     "defaults": {"temperature": 0.6, "top_p": 0.95, "max_response_len": 8192},
     "benchmarks": [{"name": "gsm8k", "n_samples_per_eval_prompt": 4, "temperature": null, "top_p": null,
                     "top_k": -1, "max_response_len": 1024}]}

`n_samples_per_eval_prompt` k becomes `repeats: k` (k sampled runs with seeds 0..k-1); absent or null, the
benchmark runs once, greedy unless a temperature is given. Unknown keys, wrong types and impossible
values are errors (`RequestError`, answered with 400), as slime's own server rejects them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpteval.results.model import TaskOutcome, flat_metrics, judge_error_values

SAMPLING_FIELDS = ("n_samples_per_eval_prompt", "temperature", "top_p", "top_k", "max_response_len")
METRIC_PREFIX = "eval"


class RequestError(ValueError):
    """The request body is not a valid evaluation request (the message says which field and why)."""


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of a request, its unset fields already taken from the request's `defaults`."""

    name: str
    n_samples_per_eval_prompt: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_response_len: int | None = None

    @property
    def repeats(self) -> int:
        """Samples per problem as ckpteval counts them (0: one run)."""
        return self.n_samples_per_eval_prompt or 0


@dataclass(frozen=True)
class EvalRequest:
    """A validated `POST /evaluate` body."""

    rollout_id: int
    router_url: str
    benchmarks: tuple[Benchmark, ...]
    defaults: Mapping[str, Any]


def _require(ok: bool, where: str, message: str) -> None:
    if not ok:
        raise RequestError(f"{where}: {message}")


def _int(value: Any, where: str, *, low: int | None = None) -> int | None:
    if value is None:
        return None
    _require(isinstance(value, int) and not isinstance(value, bool), where, f"expected an integer, got {value!r}")
    if low is not None:
        _require(value >= low, where, f"must be at least {low}, got {value}")
    return int(value)


def _float(value: Any, where: str, *, low: float, high: float) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    _require(ok, where, f"expected a number, got {value!r}")
    _require(low <= value <= high, where, f"must be between {low} and {high}, got {value}")
    return float(value)


def _sampling(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    return {
        "n_samples_per_eval_prompt": _int(raw.get("n_samples_per_eval_prompt"), f"{where}.n_samples_per_eval_prompt",
                                          low=0),
        "temperature": _float(raw.get("temperature"), f"{where}.temperature", low=0.0, high=100.0),
        "top_p": _float(raw.get("top_p"), f"{where}.top_p", low=0.0, high=1.0),
        "top_k": _int(raw.get("top_k"), f"{where}.top_k", low=-1),
        "max_response_len": _int(raw.get("max_response_len"), f"{where}.max_response_len", low=1),
    }  # fmt: skip


def _unknown(raw: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    extra = sorted(set(raw) - set(known))
    _require(not extra, where, f"unknown key(s) {', '.join(extra)}; known: {', '.join(known)}")


def parse_request(body: bytes | str | Mapping[str, Any]) -> EvalRequest:
    """Validate a `POST /evaluate` body (JSON text or already decoded); RequestError says what is wrong."""
    if isinstance(body, (bytes, str)):
        try:
            raw = json.loads(body or b"{}")
        except ValueError as exc:
            raise RequestError(f"the body is not JSON ({exc})") from None
    else:
        raw = body
    _require(isinstance(raw, dict), "body", "expected a JSON object")
    _unknown(raw, ("rollout_id", "router_url", "defaults", "benchmarks"), "body")
    _require("rollout_id" in raw, "rollout_id", "missing")
    rollout_id = _int(raw["rollout_id"], "rollout_id", low=0)
    router_url = raw.get("router_url")
    _require(isinstance(router_url, str) and router_url.startswith(("http://", "https://")), "router_url",
             f"expected an http(s) URL of the OpenAI-compatible router, got {router_url!r}")  # fmt: skip
    defaults = raw.get("defaults") or {}
    _require(isinstance(defaults, dict), "defaults", "expected an object")
    _unknown(defaults, SAMPLING_FIELDS, "defaults")
    fallback = _sampling(defaults, "defaults")
    benchmarks_raw = raw.get("benchmarks") or []
    _require(isinstance(benchmarks_raw, list), "benchmarks", "expected a list")
    benchmarks = []
    for i, entry in enumerate(benchmarks_raw):
        where = f"benchmarks[{i}]"
        _require(isinstance(entry, dict), where, "expected an object")
        _unknown(entry, ("name", *SAMPLING_FIELDS), where)
        name = str(entry.get("name") or "").strip()
        _require(bool(name), f"{where}.name", "missing or empty")
        _require(":" not in name, f"{where}.name",
                 f"{name!r} has a ':'; give the samples per prompt as n_samples_per_eval_prompt")  # fmt: skip
        own = _sampling(entry, where)
        merged = {key: own[key] if own[key] is not None else fallback[key] for key in SAMPLING_FIELDS}
        benchmarks.append(Benchmark(name=name, **merged))
    names = [b.name for b in benchmarks]
    _require(len(set(names)) == len(names), "benchmarks", f"a benchmark is named twice ({', '.join(names)})")
    assert rollout_id is not None
    return EvalRequest(
        rollout_id=rollout_id, router_url=router_url.rstrip("/"), benchmarks=tuple(benchmarks), defaults=defaults
    )


def raw_metrics(outcome: TaskOutcome) -> dict[str, Any]:
    """One benchmark's metrics as NeMo-Skills' metrics.json nests them: mode -> {metric: value, ...},
    with `<metric>_stderr`, `<metric>_std_dev` and `num_entries` beside the values, and a judged benchmark's
    `judge_errors` and `judge_judgments` where its harness counted them."""
    nested: dict[str, Any] = {}
    n_samples = None
    for key, value in flat_metrics(outcome).items():
        if key == "n_samples":
            n_samples = int(value)
            continue
        mode, metric = key.split("/", 1)
        nested.setdefault(mode, {})[metric] = value
    for metrics in nested.values():
        if n_samples is not None:
            metrics["num_entries"] = n_samples
        metrics.update(judge_error_values(outcome))  # a judged benchmark: its judge's unscored replies
    return nested


def flat_delegate_metrics(raw: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, float]:
    """`eval/<benchmark>/<mode>/<metric>` -> value for every number in `raw` (benchmark -> raw_metrics),
    the keys slime's client logs."""
    out: dict[str, float] = {}
    for benchmark, modes in raw.items():
        for mode, metrics in modes.items():
            for metric, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out[f"{METRIC_PREFIX}/{benchmark}/{mode}/{metric}"] = float(value)
    return out
