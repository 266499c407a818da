"""Send the log-likelihood requests of one context together, so the server computes the context once.

lm-eval's API models order log-likelihood requests longest first (context and continuation together),
which spreads the choices of one multiple-choice item apart: the builtin server's prefix cache then
has to keep every context until its last choice arrives. Its Hugging Face backend groups them by
context instead; here the same order is given to the API models: longest context first, the requests
of one context next to each other. Answers go back in the original order (lm-eval's `Collator` does
that), so scores are unchanged. Only where each request body holds one prompt (`batch_size` 1, the
catalog's setting): the bodies, and so the response cache's keys, are then exactly what lm-eval sends.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

_state = threading.local()


def by_context(request: Any) -> tuple[Any, ...]:
    """Sort key of a (cache key, context tokens, continuation tokens) request: longest context first, grouped."""
    _, context, continuation = request
    return -len(context), tuple(context), -len(continuation), tuple(continuation)


def patch(module: ModuleType) -> None:
    """Patch `lm_eval.models.api_models` (idempotent)."""
    api = getattr(module, "TemplateAPI", None)
    collator = getattr(module, "Collator", None)
    if api is None or collator is None or getattr(collator, "__ckpteval_patched__", False):
        return
    original = api._loglikelihood_tokens

    class ContextFirstCollator(collator):  # type: ignore[misc, valid-type]
        __ckpteval_patched__ = True

        def __init__(self, arr: Any, sort_fn: Any = None, *args: Any, **kwargs: Any) -> None:
            if getattr(_state, "by_context", False):
                sort_fn = by_context
            if sort_fn is None:
                super().__init__(arr, *args, **kwargs)
            else:
                super().__init__(arr, sort_fn, *args, **kwargs)

    def _loglikelihood_tokens(self: Any, requests: Any, **kwargs: Any) -> Any:
        _state.by_context = getattr(self, "_batch_size", 1) == 1
        try:
            return original(self, requests, **kwargs)
        finally:
            _state.by_context = False

    _loglikelihood_tokens.__wrapped__ = original  # type: ignore[attr-defined]
    module.Collator = ContextFirstCollator  # type: ignore[attr-defined]
    api._loglikelihood_tokens = _loglikelihood_tokens
