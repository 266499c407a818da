"""Plain data for presenting the library's values, shared by every front end (no rich, no Typer): the
score table's cells, a compiled config as YAML, a checkpoint description in words, a watched checkpoint's
verdicts in words.

Part of the public API (docs/architecture.md). Each name loads its module on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckpteval.checkpoint.description import summary as checkpoint_summary
    from ckpteval.config.preview import config_yaml
    from ckpteval.results.answers import shorten
    from ckpteval.results.compare import REGRESSION_EXIT_CODE
    from ckpteval.results.table import FAILED_MARK, table_rows
    from ckpteval.watch.verdicts import verdict_lines

_WHERE = {
    "config_yaml": "ckpteval.config.preview",
    "checkpoint_summary": "ckpteval.checkpoint.description:summary",
    "shorten": "ckpteval.results.answers",
    "REGRESSION_EXIT_CODE": "ckpteval.results.compare",
    "FAILED_MARK": "ckpteval.results.table",
    "table_rows": "ckpteval.results.table",
    "verdict_lines": "ckpteval.watch.verdicts",
}

__all__ = [
    "FAILED_MARK",
    "REGRESSION_EXIT_CODE",
    "checkpoint_summary",
    "config_yaml",
    "shorten",
    "table_rows",
    "verdict_lines",
]


def __getattr__(name: str) -> Any:
    """A function or constant, imported from its module on first use."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'ckpteval.views' has no attribute {name!r}")
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute or name)
