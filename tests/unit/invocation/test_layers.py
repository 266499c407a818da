"""The layers point one way (docs/architecture.md, "Layers"): every import of a ckpteval module, those inside
functions and under TYPE_CHECKING too, goes to the same package or one in a lower layer, and neither the
packages nor the modules form an import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import ckpteval

SRC = Path(ckpteval.__file__).parent
# Top to bottom; a package may import from its own layer's packages (without a cycle) and from lower layers.
LAYERS = [
    ["cli"],
    ["__init__", "types", "views"],
    ["library"],
    ["delegate", "watch"],
    ["api"],
    ["execution"],
    ["export"],
    ["report", "cluster", "results", "job"],
    ["invocation"],
    ["deploy", "hfexport"],
    ["server"],
    ["checkpoint"],
    ["config"],
    ["tasks"],
    ["errors", "notices", "merge", "routes", "registry"],
]
LAYER = {package: i for i, names in enumerate(LAYERS) for package in names}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """module -> the ckpteval modules it imports (the harness hook runs inside the harness and is left out)."""
    modules = {_module_name(p): p for p in SRC.rglob("*.py") if "harness_hook" not in p.parts}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                named = [f"{node.module}.{a.name}" for a in node.names]
                targets |= {n for n in named if n in modules} or {node.module}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
        graph[name] = {t for t in targets if t.split(".")[0] == "ckpteval" and t != name and t in modules}
    return graph


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph`, or []."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_every_package_is_in_a_layer():
    graph = _imports()
    assert sorted({_package(m) for m in graph} - set(LAYER)) == []


def test_no_import_runs_back_up():
    graph = _imports()
    upward = [f"{a} -> {b}" for a, targets in graph.items() for b in targets if LAYER[_package(a)] > LAYER[_package(b)]]
    assert upward == []


def test_neither_packages_nor_modules_form_a_cycle():
    graph = _imports()
    packages: dict[str, set[str]] = {}
    for a, targets in graph.items():
        packages.setdefault(_package(a), set()).update(_package(b) for b in targets if _package(b) != _package(a))
    assert _cycle(packages) == []
    assert _cycle(graph) == []


def test_the_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
