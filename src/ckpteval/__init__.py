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

# The imports under TYPE_CHECKING are read by type checkers; `__all__` is made from `_WHERE`, so ruff does
# not see them used.
# ruff: noqa: F401
from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ckpteval import errors  # `ckpteval.errors` is there after `import ckpteval`, as it always was

# For type checkers only; at run time each name loads from `_WHERE` (tests/unit/test_public_api.py keeps
# the two the same).
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
    from ckpteval.errors import (
        CkptevalError,
        ClusterError,
        ConfigError,
        DeploymentError,
        EvaluationError,
        ExportError,
    )
    from ckpteval.library import (
        compare,
        export_hf,
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

# The public names, each with the module it loads from on first use.
_WHERE: dict[str, str] = {
    **dict.fromkeys(
        ("CkptevalError", "ClusterError", "ConfigError", "DeploymentError", "EvaluationError", "ExportError"),
        "ckpteval.errors",
    ),
    "CompileRequest": "ckpteval.config.compose",
    **dict.fromkeys(
        (
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
        ),
        "ckpteval.api",
    ),
    **dict.fromkeys(
        (
            "compare",
            "export_hf",
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
        ),
        "ckpteval.library",
    ),
}
__all__ = sorted(_WHERE)
__version__ = "0.1.0"


def _loaded(name: str, module: str) -> property:
    def get(_package: ModuleType) -> Any:
        return getattr(importlib.import_module(module), name)

    def keep(_package: ModuleType, _value: object) -> None:
        """The import system binding the subpackage of the same name: it stays in sys.modules."""

    return property(get, keep)


class _Package(ModuleType):
    """Each public name is a property that loads it on first use (one per `_WHERE` entry, set below).
    `ckpteval.results`, `export`, `report`, `tasks` and `watch` are the API's functions though subpackages
    share their names (`from ckpteval.tasks.catalog import ...` still works: imports go through sys.modules;
    `import ckpteval.tasks.catalog as m` does not, and `from ckpteval.tasks import catalog` does)."""


for _name, _module in _WHERE.items():
    setattr(_Package, _name, _loaded(_name, _module))
del _name, _module
sys.modules[__name__].__class__ = _Package
