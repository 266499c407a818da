"""Send the requests that share a prefix together, so the server computes the prefix once.

lm-eval's API models order log-likelihood requests longest first (context and continuation together), and
generation requests by the length of their prompt, longest first. That spreads the choices of one
multiple-choice item apart, and the items of one few-shot prefix (an MMLU subject's five examples) among
every other subject's: the builtin server's prefix cache then has to keep every prefix until its last
request arrives (57 MMLU subjects' prefixes: ~30k tokens, ~1.3 GiB for SmolLM2-135M), and the items of
one subject rarely arrive together. Here the API models send log-likelihood requests in the token order
of context, then continuation, and generation requests in the text order of their prompt (within each
group of generation settings, as lm-eval groups them): a depth-first walk of the requests' prefix tree, so
every shared prefix (a subject's few-shot examples, then one item's question) is sent in one run, computed
once and reused while it is the most recently used entry of the cache, and not needed again once its run
is over. Answers go back in the original order (lm-eval's `Collator` does that), so scores are unchanged.
Only where each request body holds one prompt (`batch_size` 1, the catalog's setting): the bodies, and so
the response cache's keys, are then exactly what lm-eval sends.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

_state = threading.local()


def by_prefix(request: Any) -> tuple[Any, ...]:
    """Sort key of a (cache key, context tokens, continuation tokens) request: the tokens' order, so that requests
    sharing a prefix are neighbours (a prefix sorts before everything it begins)."""
    _, context, continuation = request
    return tuple(context), tuple(continuation)


def by_prompt(request: Any) -> str:
    """Sort key of a (prompt, generation settings, its tokens or None) generation request: the prompt's text."""
    return request[0]


def patch(module: ModuleType) -> None:
    """Patch `lm_eval.models.api_models` (idempotent)."""
    api = getattr(module, "TemplateAPI", None)
    collator = getattr(module, "Collator", None)
    if api is None or collator is None or getattr(collator, "__ckpteval_patched__", False):
        return
    original = api._loglikelihood_tokens
    original_generate = api.generate_until

    class PrefixOrderCollator(collator):  # type: ignore[misc, valid-type]
        __ckpteval_patched__ = True

        def __init__(self, arr: Any, sort_fn: Any = None, *args: Any, **kwargs: Any) -> None:
            order = getattr(_state, "order", None)
            if order is not None:
                sort_fn = order
            if sort_fn is None:
                super().__init__(arr, *args, **kwargs)
            else:
                super().__init__(arr, sort_fn, *args, **kwargs)

    def _loglikelihood_tokens(self: Any, requests: Any, **kwargs: Any) -> Any:
        _state.order = by_prefix if getattr(self, "_batch_size", 1) == 1 else None
        try:
            return original(self, requests, **kwargs)
        finally:
            _state.order = None

    def generate_until(self: Any, requests: Any, *args: Any, **kwargs: Any) -> Any:
        _state.order = by_prompt if getattr(self, "_batch_size", 1) == 1 else None
        try:
            return original_generate(self, requests, *args, **kwargs)
        finally:
            _state.order = None

    _loglikelihood_tokens.__wrapped__ = original  # type: ignore[attr-defined]
    generate_until.__wrapped__ = original_generate  # type: ignore[attr-defined]
    module.Collator = PrefixOrderCollator  # type: ignore[attr-defined]
    api._loglikelihood_tokens = _loglikelihood_tokens
    api.generate_until = generate_until
