"""Make lm-eval's `timeout` (nemo-evaluator's `request_timeout`) bound one request, never the queue.

nvidia-lm-eval 26.3 (`lm_eval/models/api_models.py`, `TemplateAPI.get_batched_requests`) creates one task
per request at once and sends them through one aiohttp session with `ClientTimeout(total=timeout)` and a
connector limited to `num_concurrent` connections. aiohttp starts a request's total timeout when the
request is made, before it waits for a free connection, so request number N waits about
N / num_concurrent answers before it is even sent and times out unsent once that exceeds `timeout`: a
task whose whole run lasts longer than `request_timeout` dies with `TimeoutError` although every request
is answered in a second (NVIDIA-NeMo/Evaluator#974).

`patch(module)` wraps `get_batched_requests`: each attempt of a request first takes one of
`num_concurrent` slots and only then calls the harness's own `amodel_call`, so the connector never queues
and the timeout counts the request's own time (connect, send, wait for the answer, read it). Retries,
payloads, parsing and caching stay the harness's. A request that really takes longer than the timeout
still fails, after the harness's retries, with a `RequestTimeoutError` that names the setting.

Self-contained (standard library only): it runs inside the harness's process through the hook directory.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from types import ModuleType
from typing import Any

PATCHED_MODULE = "lm_eval.models.api_models"
_MARK = "__ckpteval_request_timeout__"


class RequestTimeoutError(TimeoutError):
    """One request got no complete answer within the harness's timeout (`request_timeout`)."""


def timeout_message(timeout: Any, url: Any) -> str:
    """What a timed-out request says: how long, where to, and which setting raises the bound."""
    return (
        f"no complete answer from {url} within request_timeout={timeout} s for one request "
        "(its own time: connect, generate, read; waiting for a free connection is not counted). "
        "Raise evaluation.nemo_evaluator_config.config.params.request_timeout if the server is this slow."
    )


def _wrap(original: Any) -> Any:
    @functools.wraps(original)
    async def get_batched_requests(self: Any, *args: Any, **kwargs: Any) -> Any:
        amodel_call = getattr(self, "amodel_call", None)
        if amodel_call is None or "amodel_call" in vars(self):  # not the shape we know, or nested: leave it
            return await original(self, *args, **kwargs)
        slots = asyncio.Semaphore(max(1, int(getattr(self, "_concurrent", 1) or 1)))

        async def one_request(*a: Any, **kw: Any) -> Any:
            session = kw.get("session")
            async with slots:
                if getattr(session, "closed", False):
                    # the batch has already failed (another request gave up) and closed its session: a request
                    # still waiting for a slot ends quietly instead of logging "Session is closed" over the
                    # reason the task failed
                    raise asyncio.CancelledError
                try:
                    return await amodel_call(*a, **kw)
                except RequestTimeoutError:
                    raise
                except TimeoutError as exc:  # aiohttp's total timeout (asyncio.TimeoutError is TimeoutError)
                    raise RequestTimeoutError(timeout_message(getattr(self, "timeout", "?"), self.base_url)) from exc
                except Exception:
                    if getattr(session, "closed", False):  # in flight when the failed batch closed the session
                        raise asyncio.CancelledError from None
                    raise

        self.amodel_call = one_request  # the original wraps `self.amodel_call` in its retry
        try:
            return await original(self, *args, **kwargs)
        finally:
            del self.amodel_call

    setattr(get_batched_requests, _MARK, True)
    return get_batched_requests


def patch(module: ModuleType) -> None:
    """Patch `module.TemplateAPI.get_batched_requests` (idempotent; a harness without it is left alone)."""
    api = getattr(module, "TemplateAPI", None)
    original = getattr(api, "get_batched_requests", None)
    if api is None or original is None or getattr(original, _MARK, False):
        return
    if not asyncio.iscoroutinefunction(original):
        print(
            "[ckpteval] lm-eval's get_batched_requests is not the coroutine we patch; request_timeout "
            "keeps lm-eval's own meaning",
            file=sys.stderr,
            flush=True,
        )
        return
    api.get_batched_requests = _wrap(original)
