"""The checkpoint side runs before submission, on the user's machine: no module of `ckpteval.checkpoint` imports
torch, megatron or the server side, at module level or inside a function (read from the source)."""

from __future__ import annotations

import ast
from pathlib import Path

import ckpteval.checkpoint

PACKAGE = Path(ckpteval.checkpoint.__file__).parent
REFUSED = ("torch", "megatron", "transformer_engine", "apex", "ckpteval.server")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def _refused(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == r or n.startswith(r + ".") for r in REFUSED))


def test_no_checkpoint_module_imports_torch_or_the_server() -> None:
    found = {p.name: _refused(_imports(p)) for p in sorted(PACKAGE.glob("*.py"))}
    assert {name: refused for name, refused in found.items() if refused} == {}
    assert len(found) > 10  # the package's modules were read


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import torch.distributed\n    from ckpteval.server.checkpoint import x\n")
    assert _refused(_imports(module)) == ["ckpteval.server.checkpoint", "torch.distributed"]
