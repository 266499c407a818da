"""Which Hugging Face datasets each task loads, read from the harness's own task definitions.

For an lm-evaluation-harness task of the catalog (its `params.task`), lm-eval's task YAML under
`lm_eval/tasks/` says what the harness loads: `dataset_path`, `dataset_name`, `dataset_kwargs`
(a `revision`), and the splits it reads (`test_split`, `validation_split`, `training_split`,
`fewshot_split`), with an owner-less legacy id (`winogrande`) turned into the repository the hub moved
it to (`allenai/winogrande`, `harness_hook/ckpteval_dataset_ids.py`). A group's YAML lists its subtasks
(by name, by tag, or as inline configs), which are resolved the same way; `include` is followed as
lm-eval does (the included file first, the including file's keys over it).

lm-eval itself is not imported: its import and task index take tens of seconds, and the dry run must
stay fast. A name index is built by scanning the YAML files' top-level `task`/`group`/`tag` lines
(about a second, once per process); only the files a task needs are parsed in full. The unit tests
check the answers against lm-eval's own `TaskManager`.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.tasks.catalog import TaskSpec
from ckpteval.tasks.harness_hook.ckpteval_dataset_ids import canonical_id

LM_EVAL_HARNESS = "lm-evaluation-harness"
# dataset_path values that are datasets' own file loaders: the data are the task's data_files, not a hub repo
FILE_LOADERS = frozenset({"json", "csv", "parquet", "text", "arrow", "pandas"})
_SPLIT_KEYS = ("training_split", "validation_split", "test_split", "fewshot_split")
_TOP_KEY = re.compile(r"""^["']?(task|group|tag|include)["']?\s*:\s*(.*?)\s*$""")
_LIST_ITEM = re.compile(r"""^\s+-\s+["']?([^"'#\s]+)["']?\s*$""")


@dataclass(frozen=True, order=True)
class DatasetRef:
    """One dataset a task loads: a hub repository (its canonical id), its config name, revision, and the
    splits read."""

    path: str
    name: str | None = None
    revision: str | None = None
    splits: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """`path[:name][@revision]`: how messages and `evaluate tasks --json` name it."""
        return self.path + (f":{self.name}" if self.name else "") + (f"@{self.revision}" if self.revision else "")

    @property
    def slug(self) -> str:
        """A file-name-safe, unique form of `key` (the manifest's name in the dataset cache)."""
        return re.sub(r"[^A-Za-z0-9._-]", "_", f"{self.path}--{self.name or ''}--{self.revision or ''}")


@dataclass(frozen=True)
class TaskData:
    """What one catalog task loads: `datasets`, or None with `unknown` saying why it is not known."""

    task: str
    datasets: tuple[DatasetRef, ...] | None
    unknown: str = ""

    @property
    def needs_none(self) -> bool:
        """True when the harness's definition loads no dataset at all."""
        return self.datasets == ()


class TaskDefinitionError(LookupError):
    """lm-eval has no task or group of that name (or its YAML cannot be read)."""


def lm_eval_tasks_dir() -> Path | None:
    """lm-eval's `tasks/` directory, found without importing lm-eval (None if it is not installed)."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "tasks"
    return path if path.is_dir() else None


@dataclass(frozen=True)
class _Index:
    tasks: dict[str, Path]
    groups: dict[str, Path]
    tags: dict[str, tuple[Path, ...]]


@functools.cache
def _scan(path: Path) -> tuple[tuple[str, str], ...]:
    """The top-level task/group/tag entries of one YAML file, without parsing it (tags may be lists)."""
    found: list[tuple[str, str]] = []
    pending_tag = False
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ()
    for line in text.splitlines():
        if pending_tag:
            item = _LIST_ITEM.match(line)
            if item:
                found.append(("tag", item.group(1)))
                continue
            if line.startswith((" ", "\t")) or not line.strip():
                continue
            pending_tag = False
        match = _TOP_KEY.match(line)
        if not match:
            continue
        key, value = match.groups()
        value = value.split(" #", 1)[0].strip().strip("\"'")
        if key == "tag" and not value:
            pending_tag = True
        elif key == "tag" and value.startswith("["):
            found.extend(("tag", v.strip().strip("\"'")) for v in value.strip("[]").split(",") if v.strip())
        elif value and not value.startswith(("[", "{")):
            found.append((key, value))
    return tuple(found)


@functools.cache
def _index(root: Path) -> _Index:
    tasks: dict[str, Path] = {}
    groups: dict[str, Path] = {}
    tags: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*.yaml")):
        entries = list(_scan(path))
        kinds = {k for k, _ in entries}
        for key, value in list(entries):
            if key == "include" and "task" in kinds:  # a task inherits the tags of the file it includes
                entries.extend(e for e in _scan(path.parent / value) if e[0] == "tag")
        for key, value in entries:
            if key == "task":
                tasks.setdefault(value, path)
            elif key == "group" and "task" not in kinds:
                groups.setdefault(value, path)
            elif key in ("tag", "group"):  # a tag, or an old-style `group:` beside a task's own name: a tag too
                tags.setdefault(value, []).append(path)
    return _Index(tasks, groups, {k: tuple(v) for k, v in tags.items()})


class _Loader:
    """PyYAML's safe loader with lm-eval's `!function` tag read as a plain string."""

    @staticmethod
    def make() -> Any:
        import yaml

        base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

        class Loader(base):  # type: ignore[misc,valid-type]
            pass

        Loader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")
        return Loader


@functools.cache
def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader.make())
    except (OSError, yaml.YAMLError) as exc:
        raise TaskDefinitionError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise TaskDefinitionError(f"{path} is not a task definition")
    include = data.pop("include", None)
    if include:
        merged: dict[str, Any] = {}
        for inc in include if isinstance(include, list) else [include]:
            merged.update(_read_yaml((path.parent / str(inc)).resolve()))
        merged.update(data)
        data = merged
    return data


def _refs_of_config(config: dict[str, Any]) -> list[DatasetRef]:
    path = config.get("dataset_path")
    if not path:
        return []
    kwargs = config.get("dataset_kwargs") or {}
    if not isinstance(kwargs, dict):
        kwargs = {}
    revision = kwargs.get("revision")
    splits = tuple(sorted({str(config[k]) for k in _SPLIT_KEYS if config.get(k)}))
    name = config.get("dataset_name")
    ref = DatasetRef(canonical_id(str(path)), str(name) if name else None, str(revision) if revision else None, splits)
    return [ref]


def _resolve(index: _Index, item: Any, seen: frozenset[str]) -> list[DatasetRef]:
    """The datasets of a task name, group name, tag, or an inline config of a group's `task` list."""
    if isinstance(item, dict):
        if "group" in item and isinstance(item.get("task"), list):
            return [r for sub in item["task"] for r in _resolve(index, sub, seen)]
        name = item.get("task")
        base: dict[str, Any] = {}
        if isinstance(name, str) and name in index.tasks:
            base = dict(_read_yaml(index.tasks[name]))
        elif isinstance(name, str) and (name in index.groups or name in index.tags):
            return _resolve(index, name, seen)
        if "include" in item:
            raise TaskDefinitionError(f"inline task config with include: {item.get('task')}")
        return _refs_of_config({**base, **item})
    name = str(item)
    if name in seen:
        return []
    seen = seen | {name}
    if name in index.groups:
        config = _read_yaml(index.groups[name])
        subtasks = config.get("task") or []
        return [
            r for sub in (subtasks if isinstance(subtasks, list) else [subtasks]) for r in _resolve(index, sub, seen)
        ]
    if name in index.tasks:
        return _refs_of_config(_read_yaml(index.tasks[name]))
    if name in index.tags:
        out = []
        for path in index.tags[name]:
            config = _read_yaml(path)
            if isinstance(config.get("task"), str):
                out.extend(_refs_of_config(config))
        return out
    raise TaskDefinitionError(f"lm-eval has no task, group or tag named '{name}'")


def _merge(refs: list[DatasetRef]) -> tuple[DatasetRef, ...]:
    """One entry per (path, name, revision), with the union of the splits read."""
    merged: dict[tuple[str, str | None, str | None], set[str]] = {}
    for ref in refs:
        merged.setdefault((ref.path, ref.name, ref.revision), set()).update(ref.splits)
    return tuple(sorted(DatasetRef(p, n, r, tuple(sorted(s))) for (p, n, r), s in merged.items()))


def lm_eval_datasets(task_name: str, *, root: Path | None = None) -> tuple[DatasetRef, ...]:
    """The datasets lm-eval's task, group or tag `task_name` loads (TaskDefinitionError if it has none such)."""
    tasks_dir = root or lm_eval_tasks_dir()
    if tasks_dir is None:
        raise TaskDefinitionError("lm-eval is not installed")
    return _merge(_resolve(_index(tasks_dir), task_name, frozenset()))


def task_data(spec: TaskSpec) -> TaskData:
    """What the catalog task `spec` loads, from its harness's definition (unknown for other harnesses)."""
    if spec.harness != LM_EVAL_HARNESS:
        return TaskData(spec.name, None, f"the {spec.harness} harness's datasets are not read by ckpteval")
    lm_task = str(spec.params.get("task") or "")
    try:
        refs = lm_eval_datasets(lm_task)
    except TaskDefinitionError as exc:
        return TaskData(spec.name, None, str(exc))
    if any(ref.path in FILE_LOADERS for ref in refs):
        return TaskData(spec.name, None, f"lm-eval task '{lm_task}' reads data files, not a hub dataset")
    return TaskData(spec.name, refs)
