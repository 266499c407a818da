"""ckpteval: benchmark scores for a trained Megatron checkpoint.

The command-line tool `evaluate` is a thin layer over the functions exported here (`ckpteval.api`,
`ckpteval.library`): every command has its call.

    import ckpteval
    outcome = ckpteval.run(configs=["tiny"])          # compile, run, follow, collect: an Outcome
    outcome.scores                                     # task -> metric -> value
    ckpteval.status(outcome.invocation), ckpteval.results(...), ckpteval.logs(...), ckpteval.cancel(...)
    ckpteval.compare([a, b]), ckpteval.report([a, b], "report.html"), ckpteval.tasks("mmlu"), ...

The public API is this module, `ckpteval.errors`, `ckpteval.types` (the values returned and the events
reported) and `ckpteval.views` (plain data for presenting them); the rest is internal (docs/architecture.md).

Nothing is printed or asked: pass `reporter=` (any callable taking an event) to see progress.
The functions load on first use, so `import ckpteval` stays light; heavy dependencies (torch, megatron,
nemo_run, wandb) are imported only where they are used.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
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
    from ckpteval.library import (
        compare,
        export_inspect,
        fetch_data,
        prepare,
        push_data,
        report,
        sample_flips,
        samples,
        serve,
        serve_delegate,
        squash,
        squash_plan,
        tasks,
        watch,
        watch_curves,
        watch_detach,
        watch_detach_dry_run,
        watch_dry_run,
        watch_hosted,
        watch_hosted_runs,
        watch_hosted_status,
        watch_runs,
        watch_stop,
    )

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
_LIBRARY = (
    "compare",
    "export_inspect",
    "fetch_data",
    "prepare",
    "push_data",
    "report",
    "sample_flips",
    "samples",
    "serve",
    "serve_delegate",
    "squash",
    "squash_plan",
    "tasks",
    "watch",
    "watch_curves",
    "watch_detach",
    "watch_detach_dry_run",
    "watch_dry_run",
    "watch_hosted",
    "watch_hosted_runs",
    "watch_hosted_status",
    "watch_runs",
    "watch_stop",
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
    "compare",
    "compile_config",
    "export",
    "export_inspect",
    "fetch_data",
    "inspect_checkpoint",
    "logs",
    "make_request",
    "prepare",
    "push_data",
    "report",
    "results",
    "resume",
    "run",
    "sample_flips",
    "samples",
    "serve",
    "serve_delegate",
    "squash",
    "squash_plan",
    "status",
    "statuses",
    "submit",
    "tasks",
    "watch",
    "watch_curves",
    "watch_detach",
    "watch_detach_dry_run",
    "watch_dry_run",
    "watch_hosted",
    "watch_hosted_runs",
    "watch_hosted_status",
    "watch_runs",
    "watch_stop",
]
__version__ = "0.1.0"


def _api_function(name: str, module: str = "api") -> property:
    def get(_module: ModuleType) -> Any:
        return getattr(importlib.import_module(f"ckpteval.{module}"), name)

    def keep(_module: ModuleType, _value: object) -> None:
        """The import system binding the subpackage of the same name: it stays in sys.modules."""

    return property(get, keep)


class _Package(ModuleType):
    """`ckpteval.results`, `export`, `report`, `tasks` and `watch` are the API's functions, though subpackages
    share their names (`from ckpteval.tasks.catalog import ...` still works: imports go through sys.modules;
    `import ckpteval.tasks.catalog as m` does not, and `from ckpteval.tasks import catalog` does)."""

    results = _api_function("results")
    export = _api_function("export")
    report = _api_function("report", "library")
    tasks = _api_function("tasks", "library")
    watch = _api_function("watch", "library")


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    """The API functions, imported on first use."""
    if name in _API:
        from ckpteval import api

        return getattr(api, name)
    if name in _LIBRARY:
        from ckpteval import library

        return getattr(library, name)
    if name == "CompileRequest":
        from ckpteval.config.compose import CompileRequest

        return CompileRequest
    raise AttributeError(f"module 'ckpteval' has no attribute {name!r}")
