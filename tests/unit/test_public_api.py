"""The public API's facades (`ckpteval`, `ckpteval.types`, `ckpteval.views`) name each lazily loaded name
once at run time, in their `_WHERE` table (`__all__` and the loading come from it); the imports type checkers
read (under TYPE_CHECKING) are checked against that table here, so the two cannot drift apart."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

FACADES = ["ckpteval", "ckpteval.types", "ckpteval.views"]


def _type_checking_imports(module: ModuleType) -> dict[str, str]:
    """name -> "module:attribute" of each import under `if TYPE_CHECKING:` in `module`'s source."""
    tree = ast.parse(Path(module.__file__ or "").read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imported in node.body:
                assert isinstance(imported, ast.ImportFrom) and imported.module
                for alias in imported.names:
                    found[alias.asname or alias.name] = f"{imported.module}:{alias.name}"
    return found


def _table(module: ModuleType) -> dict[str, str]:
    """The facade's `_WHERE`, each entry written out as "module:attribute"."""
    return {name: where if ":" in where else f"{where}:{name}" for name, where in module._WHERE.items()}


@pytest.mark.parametrize("name", FACADES)
def test_what_type_checkers_read_is_the_table(name: str):
    module = importlib.import_module(name)
    imports = _type_checking_imports(module)
    assert {n: w for n, w in imports.items() if n in module._WHERE} == _table(module)
    # anything else imported for type checkers is for the module's own signatures, and not public
    source = Path(module.__file__ or "").read_text()
    own = [n for n in imports if n not in module._WHERE]
    assert [n for n in own if n in module.__all__ or len(re.findall(rf"\b{n}\b", source)) < 2] == []


@pytest.mark.parametrize("name", FACADES)
def test_every_table_entry_is_public_and_loads(name: str):
    module = importlib.import_module(name)
    assert set(module._WHERE) <= set(module.__all__)
    for entry, where in _table(module).items():
        source, _, attribute = where.partition(":")
        assert getattr(module, entry) is getattr(importlib.import_module(source), attribute), entry


def test_the_check_sees_a_name_missing_from_the_table(tmp_path: Path):
    drifted = ModuleType("drifted")
    drifted.__file__ = str(tmp_path / "drifted.py")
    Path(drifted.__file__).write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ckpteval.api import run, status\n"
    )
    drifted._WHERE = {"run": "ckpteval.api", "status": "ckpteval.library"}  # type: ignore[attr-defined]
    assert _type_checking_imports(drifted) != _table(drifted)


def test_import_ckpteval_loads_none_of_its_modules():
    probe = "import sys, ckpteval; print(sorted(m for m in sys.modules if m.startswith('ckpteval')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "['ckpteval', 'ckpteval.errors']"
