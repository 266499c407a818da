"""The CLI goes through the library: every CLI module imports only ckpteval's public API (read from the
source, so a function-local import counts as much as one at the top of the module)."""

from __future__ import annotations

import ast
from pathlib import Path

import ckpteval

CLI = Path(ckpteval.__file__).parent / "cli"
# The public API (docs/architecture.md): the package's calls, the errors, the types of what the calls return
# and report, plain data for presenting them, and the library's notices.
PUBLIC_MODULES = {"ckpteval", "ckpteval.errors", "ckpteval.types", "ckpteval.views", "ckpteval.notices"}


def _ckpteval_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of each import of a ckpteval module in `path`; relative imports resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "ckpteval"]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from inside ckpteval.cli
                base = ["ckpteval", "cli"][: 3 - node.level]
                module = ".".join([*base, *([module] if module else [])])
            if module.split(".")[0] == "ckpteval":
                found.append((node.lineno, module, [a.name for a in node.names]))
    return found


def _offences(path: Path) -> list[str]:
    out = []
    for line, module, names in _ckpteval_imports(path):
        where = f"{path.relative_to(CLI.parent)}:{line}"
        if module == "ckpteval.cli" or module.startswith("ckpteval.cli."):
            continue
        if module not in PUBLIC_MODULES:
            out.append(f"{where} imports {module}")
        elif module == "ckpteval":
            out += [f"{where} imports ckpteval.{n}" for n in names if n not in (*ckpteval.__all__, "__version__")]
    return out


def test_every_cli_module_imports_only_the_public_api():
    modules = sorted(CLI.glob("*.py"))
    assert len(modules) > 20  # the commands are there to be read
    offences = [o for path in modules for o in _offences(path)]
    assert offences == []


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path):
    sneaky = CLI / "evaluate.py"
    source = sneaky.read_text() + "\n\ndef _f():\n    from ckpteval.results.compare import compare\n"
    copy = tmp_path / "cli" / "evaluate.py"
    copy.parent.mkdir()
    copy.write_text(source)
    lines = [(m, n) for _, m, n in _ckpteval_imports(copy)]
    assert ("ckpteval.results.compare", ["compare"]) in lines
    assert "ckpteval.results.compare" not in PUBLIC_MODULES


def test_every_public_name_resolves():
    import ckpteval.types
    import ckpteval.views

    for module in (ckpteval, ckpteval.types, ckpteval.views):
        missing = [n for n in module.__all__ if getattr(module, n, None) is None]
        assert missing == [], module.__name__
