"""ckpteval: benchmark scores for a trained Megatron checkpoint.

The command-line tool `evaluate` is a thin layer over the functions exported here (`ckpteval.api`):

    import ckpteval
    outcome = ckpteval.run(configs=["tiny"])          # compile, run, follow, collect: an Outcome
    outcome.scores                                     # task -> metric -> value
    ckpteval.status(outcome.invocation), ckpteval.results(...), ckpteval.logs(...), ckpteval.cancel(...)

Nothing is printed or asked: pass `reporter=` (any callable taking an event) to see progress.
The functions load on first use, so `import ckpteval` stays light; heavy dependencies (torch, megatron,
nemo_run, wandb) are imported only where they are used.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from ckpteval.errors import (
    CkptevalError,
    ClusterError,
    ConfigError,
    DeploymentError,
    EvaluationError,
    ExportError,
)

if TYPE_CHECKING:
    from ckpteval.api import (
        Outcome,
        cancel,
        compile_config,
        export,
        inspect_checkpoint,
        logs,
        make_request,
        results,
        resume,
        run,
        status,
        statuses,
        submit,
    )
    from ckpteval.config.compose import CompileRequest

_API = (
    "Outcome",
    "cancel",
    "compile_config",
    "export",
    "inspect_checkpoint",
    "logs",
    "make_request",
    "resume",
    "results",
    "run",
    "status",
    "statuses",
    "submit",
)

__all__ = [
    "CkptevalError",
    "ClusterError",
    "CompileRequest",
    "ConfigError",
    "DeploymentError",
    "EvaluationError",
    "ExportError",
    "Outcome",
    "cancel",
    "compile_config",
    "export",
    "inspect_checkpoint",
    "logs",
    "make_request",
    "results",
    "resume",
    "run",
    "status",
    "statuses",
    "submit",
]
__version__ = "0.1.0"


def _api_function(name: str) -> property:
    def get(_module: types.ModuleType) -> Any:
        from ckpteval import api

        return getattr(api, name)

    def keep(_module: types.ModuleType, _value: object) -> None:
        """The import system binding the subpackage of the same name: it stays in sys.modules."""

    return property(get, keep)


class _Package(types.ModuleType):
    """`ckpteval.results` and `ckpteval.export` are the API's functions, though subpackages share their
    names (`import ckpteval.results.model` still works: imports go through sys.modules)."""

    results = _api_function("results")
    export = _api_function("export")


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    """The API functions, imported on first use."""
    if name in _API:
        from ckpteval import api

        return getattr(api, name)
    if name == "CompileRequest":
        from ckpteval.config.compose import CompileRequest

        return CompileRequest
    raise AttributeError(f"module 'ckpteval' has no attribute {name!r}")
