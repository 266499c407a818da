"""The layers under the executors' registry are not shaped like any executor (docs/architecture.md, "Executors").

Read from the source, as test_where_jobs_run.py reads it: the pipeline imports nothing of the Slurm side's
package (`cluster/`: its steps come from the registries), and the pipeline, the calls (`api.py`, `library.py`),
the watcher's loop, job/, the record and the status name no executor in their code (identifiers, attributes,
string constants; prose in docstrings and comments is free). The neutral record and status hold no executor's
field: an executor's part is its own typed payload (`InvocationRecord.placement`, `InvocationStatus.executor_view`).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import ckpteval
from ckpteval.config.executors import cluster_executors, find_executor
from ckpteval.execution.backend import InvocationStatus
from ckpteval.invocation.record import FinalStatus, InvocationRecord

SRC = Path(ckpteval.__file__).parent
NEUTRAL = [
    "execution/pipeline.py",
    "execution/backend.py",
    "execution/planned.py",
    "execution/staging.py",
    "api.py",
    "library.py",
    "watch/loop.py",
    "watch/run.py",
    "watch/submit.py",
    "watch/state.py",
    "invocation/record.py",
    "job/build.py",
    "job/plan.py",
    "job/files.py",
    "job/request_groups.py",
    "job/hf_export.py",
    "job/roles.py",
    "config/profiles.py",
    "config/profile_types.py",
    "config/compile.py",
    "config/compose.py",
    "export/job.py",
    "watch/kept.py",
    "watch/curves.py",
]
# Words that only one executor's code has (its scheduler, its transport), and the names of the executors that
# run jobs on another machine ("local" is also the word for this machine and the attached mode: not counted).
EXECUTOR_WORDS = ("slurm", "sbatch", "squeue", "scancel", "nemo_run", "nemorun", *cluster_executors())
# The readers of older records, which kept the executor's part in a field named after it.
LEGACY_READERS = {"_from_v1", "_from_v2", "_V2_PLACEMENT_FIELDS"}


def _names_an_executor(text: str) -> bool:
    low = text.lower()
    return any(word in low.replace("-", "_").split("_") or (len(word) > 3 and word in low) for word in EXECUTOR_WORDS)


def executor_words(source: str) -> list[str]:
    """The places in `source`'s code (not its docstrings) that name an executor, as `line: word`."""
    tree = ast.parse(source)
    legacy = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.Assign)
        and (
            getattr(node, "name", None) in LEGACY_READERS
            or any(ast.unparse(t) in LEGACY_READERS for t in getattr(node, "targets", []))
        )
        for inner in ast.walk(node)
    }
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in legacy or id(node) in docstrings:
            continue
        words: list[str] = []
        if isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            words = [node.name]
        elif isinstance(node, ast.arg):
            words = [node.arg]
        elif isinstance(node, ast.alias):
            words = [node.name]
        elif isinstance(node, ast.ImportFrom) and node.module:
            words = [node.module]
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and not any(c.isspace() for c in node.value)
        ):
            words = [node.value]  # a name or a key, not a message (prose is free)
        found += [f"{getattr(node, 'lineno', 0)}: {w}" for w in words if _names_an_executor(w)]
    return sorted(set(found))


def test_the_neutral_layers_name_no_executor():
    named = {rel: found for rel in NEUTRAL if (found := executor_words((SRC / rel).read_text()))}
    assert named == {}


def _profile_fields_read(source: str, fields: set[str]) -> list[str]:
    """`profile.<field>` / `x.profile.<field>` in `source` for a field of `fields`, as `line: field`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in fields:
            holder = node.value
            name = (
                holder.id if isinstance(holder, ast.Name) else holder.attr if isinstance(holder, ast.Attribute) else ""
            )
            if name == "profile":
                found.append(f"{node.lineno}: {node.attr}")
    return found


def test_the_neutral_layers_read_no_executors_profile_key():
    """An executor's env.toml keys are its profile part's (`Profile.part`): the neutral layers ask the part
    (`files_dir`, `step_python`, `data_offline` ...) and read none of its fields."""
    fields = {
        f.name
        for executor in ("local", *cluster_executors())
        for f in dataclasses.fields(find_executor(executor).profile)
    }
    read = {rel: found for rel in NEUTRAL if (found := _profile_fields_read((SRC / rel).read_text(), fields))}
    assert read == {}
    assert _profile_fields_read("x = compiled.profile.partition\ny = profile.part.files_dir()", fields) == [
        "1: partition"
    ]


def test_the_pipeline_imports_nothing_of_the_cluster_package():
    """Its steps come from the registries: the executor's staging, each destination's secret step, the
    deployment backend's step before the job starts."""
    tree = ast.parse((SRC / "execution/pipeline.py").read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    ]
    assert [m for m in imported if m.startswith("ckpteval.cluster")] == []


def test_the_record_and_the_status_hold_no_executor_field():
    fields = {
        f"{cls.__name__}.{f.name}"
        for cls in (InvocationRecord, InvocationStatus, FinalStatus)
        for f in dataclasses.fields(cls)
    }
    assert [f for f in fields if _names_an_executor(f.split(".")[1]) or "process" in f or "pid" in f] == []


def test_the_check_finds_what_it_is_for():
    kinds = [
        "slurm_job: str | None = None",
        "def slurm_job_id(self): pass",
        "x = record.slurm",
        "from ckpteval.cluster.slurm import job_state",
        "if executor == 'slurm': pass",
        "spec = sbatch_spec(compiled)",
    ]
    assert [k for k in kinds if not executor_words(k)] == []
    fine = [
        '"""On Slurm the job is queued."""\nx = 1',
        "# sbatch\nx = record.placement",
        "def _from_v2(d):\n    d['slurm']",
    ]
    assert [k for k in fine if executor_words(k)] == []
