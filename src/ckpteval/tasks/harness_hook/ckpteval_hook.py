"""Patch the harness at its seams, right after its modules are imported (installed by sitecustomize).

`install()` adds an import hook that patches functions right after their modules are imported:
- `lm_eval.models.api_models`: the response cache, progress and request params of a task run without
  nemo-evaluator's interceptor proxy (`ckpteval_responses`, when the job sets `CKPTEVAL_CLIENT_OUTPUT`);
  `request_timeout` bounds one request, not its wait in the connection queue
  (`ckpteval_request_timeout`; always installed), and the first request waits for the deployment
  (`ckpteval_wait_ready`, when the job starts the client before the deployment is healthy);
  requests that share a prefix are sent together (`ckpteval_request_order`: the server's prefix cache
  computes a context, or a subject's few-shot examples, once); the documents whose requests are all answered are counted
  (`ckpteval_documents`, with `lm_eval.api.model`'s own response cache);
- `nemo_evaluator.core.input`: its endpoint probe waits for the deployment too, in the background;
- `lm_eval.filters.sanitize`: a completion with a NUL byte is code that does not parse, not a crash;
- `datasets.load_dataset`: an owner-less legacy id (`winogrande`) is loaded by its canonical id
  (`allenai/winogrande`, `ckpteval_dataset_ids`; always installed: the locked `datasets` refuses the old
  id, with or without a hub); then, with the data patches, a (path, name) we have a local copy of
  (`$CKPTEVAL_DATASET_DIR`, also under the legacy id) or packaged data for (`ckpteval_offline_data.SOURCES`)
  returns that `DatasetDict`; anything else goes to the real loader, and if that fails offline the error
  says what is missing and how to provide it;
- `evaluate.load` (always installed): "code_eval" is the hub's script while the hub serves it, else
  `ckpteval_code_eval.SandboxedCodeEval` (no hub, CKPTEVAL_SANDBOX_CODE_EVAL=1, or a hub or cache without it).

Whether the hook is active is decided once per process tree, lazily (at the first patched call):
`CKPTEVAL_OFFLINE_DATA=on` always, `off` never, `auto` when the hub is not reachable (HF_HUB_OFFLINE or
HF_DATASETS_OFFLINE set, or no HTTP answer from the hub within a few seconds). The decision is written
back to the environment so child processes inherit it instead of probing again. A local copy named by
`CKPTEVAL_DATASET_DIR` is used whatever the mode: the user asked for it explicitly.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

MODE_ENV = "CKPTEVAL_OFFLINE_DATA"
SANDBOX_ENV = "CKPTEVAL_SANDBOX_CODE_EVAL"  # "1": use the sandboxed code_eval even with a hub
_TRUE = ("1", "true", "yes", "on")
_PROBE_TIMEOUT_S = 3.0

_decision: bool | None = None
_announced: dict[str, bool] = {}
_decision_lock = threading.Lock()


def hub_reachable(timeout: float = _PROBE_TIMEOUT_S, env: Mapping[str, str] | None = None) -> bool:
    """True if the Hugging Face Hub answers over HTTP (any status) within `timeout` seconds.

    Offline switches count as unreachable. The probe honours HF_ENDPOINT and HTTP(S)_PROXY, and runs in
    a thread so a hanging DNS lookup cannot stall the caller past `timeout`. `env` (a job's variables) is
    read over this process's environment.
    """
    seen = {**os.environ, **(env or {})}
    if any(seen.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return False
    import urllib.error
    import urllib.request

    url = seen.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/") + "/api/datasets?limit=1"
    result: list[bool] = []

    def probe() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
                result.append(True)
        except urllib.error.HTTPError:
            result.append(True)  # it answered
        except (OSError, ValueError):
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return bool(result and result[0])


def offline_active() -> bool:
    """Whether packaged data stands in for the hub in this process (decided once, inherited by children)."""
    global _decision
    with _decision_lock:
        if _decision is None:
            mode = os.environ.get(MODE_ENV, "off").strip().lower()
            if mode == "auto":
                _decision = not hub_reachable()
                os.environ[MODE_ENV] = "on" if _decision else "off"
            else:
                _decision = mode == "on"
        return _decision


def _log(message: str) -> None:
    print(f"[ckpteval offline data] {message}", file=sys.stderr, flush=True)


def _patched_load_dataset(real: Callable[..., Any]) -> Callable[..., Any]:
    def load_dataset(path: Any = None, name: Any = None, *args: Any, **kwargs: Any) -> Any:
        import ckpteval_offline_data as od

        if not isinstance(path, str):
            return real(path, name, *args, **kwargs)
        # a copy saved under the legacy id (before the rename) still counts
        ids = _hook_module("ckpteval_dataset_ids")
        copy = next(filter(None, (od.local_copy(p, name) for p in (path, *ids.legacy_ids(path)))), None)
        if copy:
            import datasets

            loaded = datasets.load_from_disk(copy)
            splits = {k: len(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {"": len(loaded)}
            od.record(od.Record(path, name, "local copy", copy, splits))
            _log(f"{path} ({name}): local copy {copy}")
            return loaded
        if not offline_active():
            return real(path, name, *args, **kwargs)
        src = od.source_for(path, name)
        if src is not None:
            built = od.dataset_dict(src, name)
            od.record(
                od.Record(
                    dataset=path,
                    name=name,
                    served_from="package",
                    source=src.source(),
                    splits={k: len(v) for k, v in built.items()},
                    eval_split=src.eval_split,
                    few_shot_split=src.fewshot_split,
                    few_shot_source=src.fewshot_source,
                    harness_few_shot=src.harness_fewshot,
                    note=src.split_note,
                )
            )
            _log(f"{path} ({name}): packaged data from {src.source()}")
            return built
        try:
            return real(path, name, *args, **kwargs)
        except OSError as exc:  # DatasetNotFoundError, OfflineModeIsEnabled, ConnectionError are OSErrors
            od.record(od.Record(path, name, "missing", "", {}, note=f"{type(exc).__name__}: {exc}"[:500]))
            raise OfflineDataMissing(od.missing_message(path, name)) from exc

    load_dataset.__wrapped__ = real  # type: ignore[attr-defined]
    return load_dataset


class OfflineDataMissing(RuntimeError):
    """No hub, no packaged data, no local copy: the task cannot run here."""


def _patched_evaluate_load(real: Callable[..., Any]) -> Callable[..., Any]:
    """`evaluate.load("code_eval")`: the hub's metric script while the hub serves it; ckpteval's sandboxed
    implementation (same pass@k) with no hub, when asked (SANDBOX_ENV), or when the hub does not have the
    script: a mirror without spaces, or a job reading the dataset cache with the hub switched off. Each
    choice is said on the task's log."""

    def sandboxed(why: str) -> Any:
        import ckpteval_code_eval

        if not _announced.get("code_eval"):
            _announced["code_eval"] = True
            _log(f"code_eval: ckpteval's sandboxed implementation ({why})")
        return ckpteval_code_eval.SandboxedCodeEval()

    def load(path: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = path == "code_eval" or (isinstance(path, str) and path.rstrip("/").endswith("/code_eval"))
        if not wanted:
            return real(path, *args, **kwargs)
        if offline_active():
            return sandboxed("no hub")
        if os.environ.get(SANDBOX_ENV, "").lower() in _TRUE:
            return sandboxed(f"{SANDBOX_ENV} is set")
        try:
            return real(path, *args, **kwargs)
        except OSError as exc:  # FileNotFoundError: not on this hub, or offline with nothing cached
            return sandboxed(f"the hub's script could not be loaded: {type(exc).__name__}: {str(exc)[:200]}")

    load.__wrapped__ = real  # type: ignore[attr-defined]
    return load


def _canonical_load_dataset(real: Callable[..., Any]) -> Callable[..., Any]:
    ids = _hook_module("ckpteval_dataset_ids")

    def load_dataset(path: Any = None, *args: Any, **kwargs: Any) -> Any:
        return real(ids.canonical_id(path) if isinstance(path, str) else path, *args, **kwargs)

    load_dataset.__wrapped__ = real  # type: ignore[attr-defined]
    return load_dataset


def _patch_dataset_ids(module: ModuleType) -> None:
    module.load_dataset = _canonical_load_dataset(module.load_dataset)  # type: ignore[attr-defined]


def _patch_datasets(module: ModuleType) -> None:
    """The offline-data patch, inside the id rewrite (so it sees canonical ids, as `data fetch` names them)."""
    module.load_dataset = _patched_load_dataset(module.load_dataset)  # type: ignore[attr-defined]
    _patch_dataset_ids(module)


def _patch_evaluate(module: ModuleType) -> None:
    module.load = _patched_evaluate_load(module.load)  # type: ignore[attr-defined]


def _hook_module(name: str) -> ModuleType:
    """A module of the hook directory: as loaded by the hook (the directory is on sys.path), or as part of
    the ckpteval package."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        return importlib.import_module(f"{__package__}.{name}")


def _patch_api_models(module: ModuleType) -> None:
    _hook_module("ckpteval_responses").patch(module)  # innermost: at the HTTP call
    _hook_module("ckpteval_documents").patch_api_models(module)
    _hook_module("ckpteval_request_order").patch(module)
    _hook_module("ckpteval_request_timeout").patch(module)
    _hook_module("ckpteval_wait_ready").patch_api_models(module)  # outermost: wait, then bound each request


def _patch_model(module: ModuleType) -> None:
    _hook_module("ckpteval_documents").patch_model(module)


def _patch_sanitize(module: ModuleType) -> None:
    """lm-eval's code sanitizer (HumanEval's `build_predictions`) asks evalplus's `syntax_check` whether a
    block parses; that catches SyntaxError only, and on early Python 3.11 releases (Debian 12's 3.11.2) a
    completion holding a NUL byte raises ValueError ("source code string cannot contain null bytes"; 3.11.7
    and 3.12 say SyntaxError), which failed the whole task. Such a block does not parse: the check says
    False, the sample scores as wrong code."""
    original = getattr(module, "syntax_check", None)
    if original is None or getattr(original, "__ckpteval_patched__", False):
        return

    def syntax_check(code: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(code, *args, **kwargs)
        except ValueError:
            return False

    syntax_check.__ckpteval_patched__ = True  # type: ignore[attr-defined]
    syntax_check.__wrapped__ = original  # type: ignore[attr-defined]
    module.syntax_check = syntax_check  # type: ignore[attr-defined]


def _patch_mtbench_output(module: ModuleType) -> None:
    _hook_module("ckpteval_judge").patch_mtbench_output(module)


def _patch_judge_client(module: ModuleType) -> None:
    _hook_module("ckpteval_judge").patch_judge_client(module)


def _patch_evaluator_input(module: ModuleType) -> None:
    _hook_module("ckpteval_wait_ready").patch_input(module)


# offline data: only when asked for (see sitecustomize); its `datasets` patch includes the harness's
_DATA_PATCHES: dict[str, Callable[[ModuleType], None]] = {"datasets": _patch_datasets}
# fixes to the harness itself, and code_eval (the hub's script, else the sandboxed one): always
_HARNESS_PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "datasets": _patch_dataset_ids,
    "evaluate": _patch_evaluate,
    "lm_eval.models.api_models": _patch_api_models,
    "lm_eval.api.model": _patch_model,
    "nemo_evaluator.core.input": _patch_evaluator_input,
    "lm_eval.filters.sanitize": _patch_sanitize,
    "core_evals.mtbench.output": _patch_mtbench_output,
    # MT-Bench's judge client, as its judging subprocess imports it (from its own directory) and as a package
    "fastchat.clients.openai": _patch_judge_client,
    "mtbench_evaluator.fastchat.fastchat.clients.openai": _patch_judge_client,
}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self._inner = inner
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._patch(module)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds the patched modules through the other finders and wraps their loader to patch after import."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def install(*, data: bool = True) -> None:
    """Install the import hook (idempotent); patches modules already imported right away.

    The harness fixes and code_eval are always installed; `data` adds the offline-data patches.
    """
    patches = {**_HARNESS_PATCHES, **(_DATA_PATCHES if data else {})}
    finder = next((f for f in sys.meta_path if isinstance(f, _PatchingFinder)), None)
    if finder is None:
        finder = _PatchingFinder({})
        sys.meta_path.insert(0, finder)
    for name, patch in patches.items():
        if name in finder.patches:
            continue
        finder.patches[name] = patch
        if name in sys.modules:
            patch(sys.modules[name])
