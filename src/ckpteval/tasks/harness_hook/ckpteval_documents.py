"""Documents done, so that a task's progress counts what its results count (lm-eval tasks).

lm-eval hands its model one list of requests per request type (`loglikelihood`, `generate_until`,
`loglikelihood_rolling`), each request an `Instance` of one document (`task_name`, `doc_id`): a
multiple-choice document sends one log-likelihood request per choice, a generation document one request
(per lm-eval repeat). The answers come back one request at a time through the model's cache hook
(`add_partial`), in lm-eval's own order, so a document is done when the last of its requests is answered.
Two seams, when the job sets `CKPTEVAL_CLIENT_OUTPUT` to the task's output directory:

- lm-eval's own response cache (`CachingLM`, the harness runs with `--use_cache`): the requests of each call
  are registered before it looks in its cache; those it answers from there are done once it hands the rest
  to the model (or returns, when nothing is left);
- the API model (`TemplateAPI`): it counts every answer its cache hook is given (the endpoint's, or one
  replayed by `ckpteval_responses`); requests nobody registered (no lm-eval cache) are registered here.

`<output_dir>/progress_docs` holds "DONE TOTAL": the documents of this run whose every request is answered,
and the documents it evaluates (known once lm-eval hands over its requests; each request type adds its own),
rewritten at most every 0.5 s and after each call. Self-contained (standard library only).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any

OUTPUT_ENV = "CKPTEVAL_CLIENT_OUTPUT"  # ckpteval_responses's: the task's output directory
DOCS_FILE = "progress_docs"
WRITE_INTERVAL_S = 0.5
REQUEST_TYPES = ("loglikelihood", "generate_until", "loglikelihood_rolling")
_MARK = "__ckpteval_documents__"

Key = tuple[str, ...]  # a request as its answer names it: (request type, its text arguments)
Doc = tuple[Any, Any]  # (task name, document id)


def request_key(method: str, args: Any) -> Key:
    """A request's key from its type and arguments: the text ones (a generation's settings dict is the same
    for every document of a task, and lm-eval's cache hook gets a copy of it)."""
    return (method, *(a for a in args if isinstance(a, str)))


class DocumentCounter:
    """Which documents have all their requests answered (one counter per harness process)."""

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir) / DOCS_FILE
        self._lock = threading.Lock()
        self._open: dict[Doc, int] = {}  # document -> its requests not answered yet
        self._docs: set[Doc] = set()
        self._waiting: dict[Key, list[Doc]] = defaultdict(list)  # request -> the documents that sent it, in turn
        self._registered: tuple[str, list[Any]] | None = None  # a call registered, not yet handed to the model
        self.done = 0
        self._written = 0.0

    def register(self, method: str, requests: list[Any]) -> None:
        """The requests of one call (`Instance`s: args, task_name, doc_id), before any is answered."""
        with self._lock:
            self._add(method, requests)
            self._registered = (method, list(requests))

    def handed(self, method: str, requests: list[Any]) -> None:
        """The model is given `requests`: those of the registered call left out were answered from lm-eval's
        cache; with no call registered (no cache), these are registered now."""
        with self._lock:
            registered, self._registered = self._registered, None
            if registered is None or registered[0] != method:
                self._add(method, requests)
                return
            given = Counter(id(r) for r in requests)
            for request in registered[1]:
                if given[id(request)] > 0:
                    given[id(request)] -= 1
                else:
                    self._answer(request_key(method, request.args))
        self.write()

    def returned(self, method: str, requests: list[Any]) -> None:
        """A registered call has returned: every request of it is answered (from the cache, or by the model)."""
        with self._lock:
            if self._registered is not None and self._registered[0] == method:
                self._registered = None
                for request in requests:
                    self._answer(request_key(method, request.args))
            self._written = 0.0
        self.write()

    def answered(self, method: str, args: Any) -> None:
        """One request answered (lm-eval's cache hook)."""
        with self._lock:
            self._answer(request_key(method, args if isinstance(args, tuple) else (args,)))
        if time.monotonic() - self._written >= WRITE_INTERVAL_S:
            self.write()

    def _add(self, method: str, requests: list[Any]) -> None:
        for request in requests:
            doc = (getattr(request, "task_name", None), getattr(request, "doc_id", None))
            self._docs.add(doc)
            self._open[doc] = self._open.get(doc, 0) + 1
            self._waiting[request_key(method, request.args)].append(doc)

    def _answer(self, key: Key) -> None:
        waiting = self._waiting.get(key)
        if not waiting:
            return  # not one of the registered requests (a probe), or answered already
        doc = waiting.pop(0)
        self._open[doc] -= 1
        if self._open[doc] == 0:
            self.done += 1

    def write(self) -> None:
        """Rewrite the file (atomically: a reader never sees half of it)."""
        with self._lock:
            self._written = time.monotonic()
            text = f"{self.done} {len(self._docs)}\n"
        with contextlib.suppress(OSError):  # progress is for display; never fail the task over it
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, self.path)


class _CountingHook:
    """lm-eval's cache hook, also telling the counter of every answer."""

    def __init__(self, inner: Any, counter: DocumentCounter) -> None:
        self._inner = inner
        self._counter = counter

    def add_partial(self, method: str, args: Any, result: Any) -> None:
        self._inner.add_partial(method, args, result)
        self._counter.answered(method, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


_counter: DocumentCounter | None = None
_counter_lock = threading.Lock()


def counter() -> DocumentCounter | None:
    """This process's counter, when the job asked for one (`CKPTEVAL_CLIENT_OUTPUT`); created once."""
    global _counter
    output = os.environ.get(OUTPUT_ENV, "").strip()
    if not output or not Path(output).is_dir():
        return None
    with _counter_lock:
        if _counter is None:
            _counter = DocumentCounter(output)
        return _counter


def _counted_model_call(method: str, original: Any) -> Any:
    @functools.wraps(original)
    def call(self: Any, requests: Any, *args: Any, **kwargs: Any) -> Any:
        docs = counter()
        if docs is not None and isinstance(requests, list):
            docs.handed(method, requests)
            if not isinstance(self.cache_hook, _CountingHook):
                self.cache_hook = _CountingHook(self.cache_hook, docs)
        try:
            return original(self, requests, *args, **kwargs)
        finally:
            if docs is not None:
                docs.write()

    setattr(call, _MARK, True)
    return call


def patch_api_models(module: ModuleType) -> None:
    """Count the answers of `lm_eval.models.api_models.TemplateAPI` (idempotent)."""
    api = getattr(module, "TemplateAPI", None)
    if api is None:
        return
    for method in REQUEST_TYPES:
        original = getattr(api, method, None)
        if original is not None and not getattr(original, _MARK, False):
            setattr(api, method, _counted_model_call(method, original))


class ServedCache:
    """lm-eval's response cache (`CachingLM.dbdict`) keyed by the checkpoint content the deployment serves
    (`ckpteval_responses.Recorder.serving`): an answer cached while another checkpoint was served is not
    replayed; each replay is counted (`Recorder.lm_eval_replayed`, into served.json and response_stats)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._prefix: str | None = None

    def _key(self, key: str) -> str:
        if self._prefix is None:
            self._prefix = _served_prefix()
        return f"{self._prefix}{key}"

    def __contains__(self, key: Any) -> bool:
        return self._key(key) in self._inner

    def __getitem__(self, key: Any) -> Any:
        value = self._inner[self._key(key)]
        rec = _responses().recorder()
        if rec is not None:
            with rec._lock:
                rec.lm_eval_replayed += 1
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        self._inner[self._key(key)] = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _responses() -> ModuleType:
    import importlib

    try:
        return importlib.import_module("ckpteval_responses")
    except ImportError:
        return importlib.import_module(f"{__package__}.ckpteval_responses")


def _served_prefix() -> str:
    """ "<content sha256>:" of the checkpoint served (after waiting for the deployment: the cache is looked in
    before the first request), "" when the deployment reports none."""
    import importlib

    try:
        ready = importlib.import_module("ckpteval_wait_ready")
    except ImportError:
        ready = importlib.import_module(f"{__package__}.ckpteval_wait_ready")
    ready.wait_for_deployment()
    rec = _responses().recorder()
    served = rec.serving() if rec is not None else None
    return f"{served}:" if served else ""


def patch_model(module: ModuleType) -> None:
    """Register each call's requests in `lm_eval.api.model.CachingLM` before it looks in its cache, and key its
    cache by the checkpoint served (idempotent)."""
    caching: Any = getattr(module, "CachingLM", None)
    original = getattr(caching, "__getattr__", None)
    if original is None or getattr(original, _MARK, False):
        return
    init = caching.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if counter() is not None and not isinstance(getattr(self, "dbdict", None), ServedCache):
            self.dbdict = ServedCache(self.dbdict)

    caching.__init__ = __init__

    @functools.wraps(original)
    def __getattr__(self: Any, attr: str) -> Any:
        fn = original(self, attr)
        docs = counter()
        if attr not in REQUEST_TYPES or docs is None or not callable(fn):
            return fn

        def counted(requests: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(requests, list):
                return fn(requests, *args, **kwargs)
            docs.register(attr, requests)
            result = fn(requests, *args, **kwargs)
            docs.returned(attr, requests)
            return result

        return counted

    setattr(__getattr__, _MARK, True)
    caching.__getattr__ = __getattr__
