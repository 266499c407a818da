"""A task client prepares while the model loads, and sends its first request once the deployment is healthy.

The job starts the task clients together with the deployment, not once it is healthy, and gives each the
deployment's health URL (`CKPTEVAL_DEPLOYMENT_HEALTH`) and how long the job waits for it
(`CKPTEVAL_DEPLOYMENT_WAIT_S`). The client does its slow part meanwhile: imports, dataset load, few-shot
and request building. What would reach the model first waits here until the health URL answers 200:

- nemo-evaluator's `verify_capabilities` (one probe request before the harness starts; nemo-evaluator
  only logs its outcome) runs in a background thread once the deployment is healthy, and returns True at
  once, so the harness starts preparing;
- lm-eval's `TemplateAPI.model_call` and `get_batched_requests` wait before their first request.

The wait happens once per process (later callers find it done) and is bounded by the job's own wait plus
a margin: past it the request goes out and fails as it would have. The job stops every client when the
deployment fails, so a client never waits for a deployment that is gone. Then, also with no deployment to
wait for, the request waits for the task's turn (`ckpteval_request_turn`: the job probes the endpoint first,
and may run tasks whose request settings differ one group after another).

Before the first request the client also checks that the endpoint is *its job's* deployment: the job names
the identity token its deployment reports (`CKPTEVAL_DEPLOYMENT_IDENTITY`) and where it reports it
(`CKPTEVAL_DEPLOYMENT_IDENTITY_URL`, see `ckpteval.server.identity`). An endpoint that answers without it is
another deployment (another job's server on this port): the client says so and exits (code 3) without
sending a single request, so no score can come from a model the job did not start.

Self-contained (standard library only): it runs inside the harness's processes through the hook directory.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from types import ModuleType
from typing import Any

try:  # as the hook loads it (the hook directory on sys.path), or as part of the ckpteval package
    import ckpteval_request_turn as _turn
except ImportError:
    from ckpteval.tasks.harness_hook import ckpteval_request_turn as _turn

HEALTH_ENV = "CKPTEVAL_DEPLOYMENT_HEALTH"
WAIT_ENV = "CKPTEVAL_DEPLOYMENT_WAIT_S"
IDENTITY_ENV = "CKPTEVAL_DEPLOYMENT_IDENTITY"
IDENTITY_URL_ENV = "CKPTEVAL_DEPLOYMENT_IDENTITY_URL"
WRONG_DEPLOYMENT_EXIT = 3
_MARGIN_S = 60.0
_POLL_S = 0.5
_MARK = "__ckpteval_wait_ready__"

_ready = threading.Event()
_lock = threading.Lock()
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # like the harness: no HTTP proxy


def _log(message: str) -> None:
    print(f"[ckpteval] {message}", file=sys.stderr, flush=True)


def healthy(url: str, timeout: float = 5.0) -> bool:
    """True when `url` answers 200 now."""
    try:
        with _direct.open(url, timeout=timeout) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


def _body(url: str, timeout: float = 5.0) -> str:
    """The body `url` answers with (an error status's too); empty when nothing answers."""
    try:
        with _direct.open(url, timeout=timeout) as response:
            return response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.read().decode(errors="replace")
    except (OSError, ValueError):
        return ""


def identity_problem() -> str | None:
    """Why the endpoint is not this job's deployment, or None when it is (or there is nothing to check)."""
    identity = os.environ.get(IDENTITY_ENV, "").strip()
    url = os.environ.get(IDENTITY_URL_ENV, "").strip()
    if not identity or not url:
        return None
    body = _body(url)
    if identity in body:
        return None
    answer = " ".join(body.split())[:200] or "no answer"
    return (
        f"{url} answers for another deployment: this job's deployment reports identity {identity}, "
        f"the endpoint answered {answer!r}. No request was sent."
    )


def _refuse_other_deployment() -> None:
    problem = identity_problem()
    if problem is not None:
        _log(f"refusing to evaluate: {problem}")
        os._exit(WRONG_DEPLOYMENT_EXIT)  # at once, from any thread: the harness must not send anything


def _limit_s() -> float:
    try:
        return max(0.0, float(os.environ.get(WAIT_ENV, "") or 600)) + _MARGIN_S
    except ValueError:
        return 600 + _MARGIN_S


def wait_for_deployment(*, announce: bool = True) -> float:
    """Block until the deployment named by the environment is healthy (at once if none is named), then
    until this task's turn (`ckpteval_request_turn`); the seconds waited. `announce`: say in the client's
    log that (and how long) the request waited."""
    return _wait_for_health(announce=announce) + _turn.wait_for_turn(announce=announce)


def _wait_for_health(*, announce: bool = True) -> float:
    url = os.environ.get(HEALTH_ENV, "").strip()
    if not url or _ready.is_set():
        return 0.0
    with _lock:
        if _ready.is_set():
            return 0.0
        waited = _wait_healthy(url, announce=announce)
        _refuse_other_deployment()
        _ready.set()
        return waited


def _wait_healthy(url: str, *, announce: bool) -> float:
    """Poll `url` until it answers 200 (bounded); the seconds waited."""
    start = time.monotonic()
    announced = False
    while not healthy(url):
        waited = time.monotonic() - start
        if waited > _limit_s():
            _log(f"the deployment ({url}) is still not healthy after {waited:.0f} s; sending anyway")
            break
        if announce and not announced:
            _log(f"prepared; waiting for the deployment ({url}) before the first request")
            announced = True
        time.sleep(_POLL_S)
    waited = time.monotonic() - start
    if announced:
        _log(f"the deployment is healthy: first request after waiting {waited:.1f} s")
    return waited


def _nothing_to_wait_for() -> bool:
    """Healthy (or no deployment named) and this task's turn open: a request goes at once."""
    healthy_now = _ready.is_set() or not os.environ.get(HEALTH_ENV, "").strip()
    return healthy_now and _turn.turn_is_open()


def _wrap_sync(original: Any) -> Any:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        wait_for_deployment()
        return original(*args, **kwargs)

    setattr(call, _MARK, True)
    return call


def _wrap_async(original: Any) -> Any:
    @functools.wraps(original)
    async def call(*args: Any, **kwargs: Any) -> Any:
        if not _nothing_to_wait_for():
            await asyncio.get_running_loop().run_in_executor(None, wait_for_deployment)
        return await original(*args, **kwargs)

    setattr(call, _MARK, True)
    return call


def patch_api_models(module: ModuleType) -> None:
    """lm-eval: `TemplateAPI.model_call` and `get_batched_requests` wait for the deployment first."""
    api = getattr(module, "TemplateAPI", None)
    if api is None:
        return
    for name, wrap in (("model_call", _wrap_sync), ("get_batched_requests", _wrap_async)):
        original = getattr(api, name, None)
        if original is None or getattr(original, _MARK, False):
            continue
        if name == "get_batched_requests" and not asyncio.iscoroutinefunction(original):
            continue
        setattr(api, name, wrap(original))


def patch_input(module: ModuleType) -> None:
    """nemo-evaluator: `verify_capabilities` probes the endpoint in the background once it is healthy."""
    original = getattr(module, "verify_capabilities", None)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def verify_capabilities(*args: Any, **kwargs: Any) -> Any:
        url = os.environ.get(HEALTH_ENV, "").strip()
        if _turn.turn_is_open() and (not url or _ready.is_set() or healthy(url)):
            wait_for_deployment(announce=False)  # at once here: the identity check before the probe request
            return original(*args, **kwargs)

        def later() -> None:
            wait_for_deployment(announce=False)  # the harness's first request says it
            try:
                original(*args, **kwargs)
            except Exception as exc:  # it only ever logged; keep it that way
                _log(f"capability check failed: {type(exc).__name__}: {exc}")

        threading.Thread(target=later, name="ckpteval-verify-capabilities", daemon=True).start()
        return True

    setattr(verify_capabilities, _MARK, True)
    module.verify_capabilities = verify_capabilities  # type: ignore[attr-defined]
