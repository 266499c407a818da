"""Nothing outside the job backends and their registry asks where a job runs (docs/architecture.md, "Executors").

The source is read, as test_layers.py reads imports: a module outside the backends may not compare anything
executor-like with an executor's name, look a table up by an executor, test for an executor's config
section with isinstance, spell the executors in a Literal or a table, or import a backend module. What it
may ask is a trait of the registered executor (`ckpteval.config.executors`) or of its config section.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ckpteval
from ckpteval.config.executors import executor_names

SRC = Path(ckpteval.__file__).parent
BACKENDS = {"execution/local.py", "execution/slurm.py", "execution/slurm_state.py", "execution/ssh.py"}
REGISTRY = {"config/executors.py", "execution/backends.py"}
# The Slurm backend's own package: nemo-run, sbatch, squash, the SSH seam (DESIGN.md's layout).
SLURM_BACKEND_PACKAGE = "cluster/"
# Where each executor's config section is declared: its fields and the traits the rest asks about.
SECTIONS = {"config/schema.py"}
# Records written before version 3 kept the executor's part in a field named after it.
OLD_RECORDS = {"invocation/record.py"}
ALLOWED = BACKENDS | REGISTRY | SECTIONS | OLD_RECORDS
EXECUTION_SECTIONS = {"LocalExecution", "SlurmExecution", "SshExecution"}
BACKEND_MODULES = {f"ckpteval.execution.{m}" for m in ("local", "slurm", "slurm_state", "ssh")}


def _names_an_executor(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in executor_names()


def _executor_like(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return "executor" in text or "execution" in text


def branches(source: str) -> list[str]:
    """The places in `source` that ask where a job runs, as `line: code`."""
    found: list[tuple[int, str]] = []
    tree = ast.parse(source)
    # how a profile reaches its machine (`tunnel`: "ssh" or "local") is a transport, not an executor
    transports = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "tunnel"
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in transports:
            continue
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_an_executor(s) for s in sides) and any(_executor_like(s) for s in sides):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Subscript):
            index = node.slice
            if _executor_like(index) and not isinstance(index, ast.Constant) and "executor" in ast.unparse(index):
                found.append((node.lineno, ast.unparse(node)))
            spelled = [e for e in ast.walk(index) if _names_an_executor(e)]
            if ast.unparse(node.value).endswith("Literal") and len(spelled) >= 2:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Dict):
            if sum(1 for k in node.keys if k is not None and _names_an_executor(k)) >= 2:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "isinstance" and len(node.args) == 2:
            classes = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            if classes & EXECUTION_SECTIONS:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.module:
            named = {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            if named & BACKEND_MODULES:
                found.append((node.lineno, f"from {node.module} import ..."))
    return [f"{line}: {code}" for line, code in sorted(set(found))]


def test_nothing_outside_the_backends_asks_where_a_job_runs():
    asking = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in ALLOWED or rel.startswith(SLURM_BACKEND_PACKAGE):
            continue
        found = branches(path.read_text())
        if found:
            asking[rel] = found
    assert asking == {}


def test_the_check_finds_each_kind_of_branch():
    """Each shape of branch this codebase had before the registry (and a few it might grow) is found."""
    kinds = [
        'if profile.executor == "slurm":\n    pass',
        'group = "slurm/default" if profile.executor == "slurm" else "local"',
        "if record.executor != 'local':\n    pass",
        'if compiled.execution_type == "local":\n    pass',
        'if config.execution.type == "slurm":\n    pass',
        "DEFAULT = {'slurm': 4, 'local': 1}",
        "n = DEFAULT_MAX_PENDING[profile.executor]",
        "if isinstance(execution, SlurmExecution):\n    pass",
        "ok = isinstance(execution, (LocalExecution, SlurmExecution))",
        'Executor = Literal["local", "slurm"]',
        "from ckpteval.execution.slurm import SlurmBackend",
        "from ckpteval.execution import local",
    ]
    missed = [code for code in kinds if not branches(code)]
    assert missed == []


def test_the_check_lets_traits_and_modes_pass():
    fine = [
        "if not find_executor(profile.executor).on_cluster:\n    pass",
        "if not execution.runs_containers:\n    pass",
        'if request.mode != "local" and request.profile is None:\n    pass',
        'if profile.tunnel == "local":\n    pass',
        "backend = backend_for(record.executor)",
    ]
    flagged = {code: branches(code) for code in fine if branches(code)}
    assert flagged == {}
