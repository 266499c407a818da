"""ckpteval's start-up hook for the task client's Python processes (nemo-evaluator, lm-eval).

ckpteval puts this directory first on PYTHONPATH for the task client only. At interpreter start-up it
installs `ckpteval_hook`: always its fixes to the harness (`request_timeout` per request), and its data
patches when they may be needed (CKPTEVAL_OFFLINE_DATA=auto|on, a local dataset copy in
CKPTEVAL_DATASET_DIR, or CKPTEVAL_SANDBOX_CODE_EVAL=1). Installing imports nothing heavy: the hook acts
when the harness imports `lm_eval.models.api_models`, `datasets` or `evaluate`. Then it runs the
`sitecustomize` this file shadows (e.g. Debian's), if any.
"""

from __future__ import annotations


def _install() -> None:
    import os

    import ckpteval_hook

    env = os.environ
    data = bool(
        env.get("CKPTEVAL_OFFLINE_DATA", "off").strip().lower() in ("auto", "on")
        or env.get("CKPTEVAL_DATASET_DIR")
        or env.get("CKPTEVAL_SANDBOX_CODE_EVAL", "").strip().lower() in ("1", "true", "yes", "on")
    )
    ckpteval_hook.install(data=data)


def _chain() -> None:
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.abspath(os.path.dirname(candidate)) == here or not os.path.isfile(candidate):
            continue
        spec = importlib.util.spec_from_file_location("_sitecustomize_shadowed_by_ckpteval", candidate)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        return


_install()
_chain()
