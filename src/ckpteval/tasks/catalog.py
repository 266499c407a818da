"""The task catalog, read from nemo-evaluator-launcher's own task definitions.

The launcher (0.2.6) ships `resources/all_tasks_irs.yaml`: every harness with its eval-factory
container, and every task with its command template, default parameters, endpoint types and
required capabilities. We read that file directly (the launcher's Python package is not imported:
it pulls in much more than a YAML file) so `-t` names, defaults and images are exactly the launcher's.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.errors import ConfigError, EvaluationError, close_matches
from ckpteval.tasks.judging import JudgeUse, judge_use

LAUNCHER_PACKAGE = "nemo_evaluator_launcher"
CATALOG_FILE = "resources/all_tasks_irs.yaml"


@dataclass(frozen=True)
class TaskSpec:
    """One task of the catalog, as the launcher defines it."""

    name: str
    harness: str
    description: str
    container: str
    endpoint_types: tuple[str, ...]
    capabilities: tuple[str, ...]
    command: str
    params: dict[str, Any] = field(hash=False)
    eval_type: str = ""
    framework_name: str = ""
    pkg_name: str = ""
    target_defaults: dict[str, Any] = field(default_factory=dict, hash=False)
    judge: JudgeUse | None = None  # how it uses a judge model (`ckpteval.tasks.judging`); None: it does not

    @property
    def needs_judge(self) -> bool:
        """True when the task is scored by a judge model: it cannot run without one."""
        return self.judge is not None and self.judge.required

    @property
    def qualified_name(self) -> str:
        """`harness.task`, unambiguous across harnesses."""
        return f"{self.harness}.{self.name}"

    @property
    def needs_logprobs(self) -> bool:
        """True for loglikelihood tasks: they need a completions endpoint with echo + logprobs."""
        return "logprobs" in self.capabilities

    @property
    def default_endpoint_type(self) -> str:
        """The endpoint type used when the config does not name one."""
        return self.endpoint_types[0] if self.endpoint_types else "completions"


@dataclass(frozen=True)
class Catalog:
    """All tasks, looked up by name or by `harness.task`."""

    tasks: tuple[TaskSpec, ...]
    source: Path

    @functools.cached_property
    def _by_name(self) -> dict[str, list[TaskSpec]]:
        index: dict[str, list[TaskSpec]] = {}
        for task in self.tasks:
            index.setdefault(task.name, []).append(task)
            index.setdefault(task.qualified_name, []).append(task)
        return index

    def names(self) -> list[str]:
        """Every name `-t` accepts (bare names and `harness.task`)."""
        return sorted(self._by_name)

    def ref(self, spec: TaskSpec) -> str:
        """The name `-t` takes for `spec` in a command a user copies: its own, or `harness.task` where
        another harness has a task of that name (`ifeval`: lm-evaluation-harness's and codec's)."""
        return spec.qualified_name if len(self._by_name.get(spec.name) or ()) > 1 else spec.name

    def get(self, name: str) -> TaskSpec:
        """The task called `name`; an unknown or ambiguous name is a ConfigError with suggestions."""
        found = self._by_name.get(name)
        if not found:
            suggestions = close_matches(name, self._by_name, n=5)
            hint = ("Close names: " + ", ".join(suggestions) + ". ") if suggestions else ""
            raise ConfigError(f"Unknown task '{name}'.", hint=hint + "`evaluate tasks` lists every task.")
        if len(found) > 1:
            options = ", ".join(t.qualified_name for t in found)
            raise ConfigError(
                f"Task name '{name}' is ambiguous: it exists in several harnesses.", hint=f"Name one of: {options}."
            )
        return found[0]

    def search(self, pattern: str | None = None, *, harness: str | None = None) -> list[TaskSpec]:
        """Tasks whose name contains `pattern` (case-insensitive), optionally of one harness."""
        out = []
        for task in self.tasks:
            if harness and task.harness != harness:
                continue
            if pattern and pattern.lower() not in task.qualified_name.lower():
                continue
            out.append(task)
        return out

    def no_match_hint(self, pattern: str | None = None, *, harness: str | None = None) -> str:
        """What to try when `search(pattern, harness=harness)` finds nothing: the harness meant, or the
        names that match once case, '-' and '_' are set aside (`mt-bench` -> mtbench)."""
        harnesses = sorted({t.harness for t in self.tasks})
        if harness and harness not in harnesses:
            near = [h for h in harnesses if _squashed(harness) in _squashed(h)] or close_matches(harness, harnesses)
            meant = f" Did you mean --harness {near[0]}?" if near else ""
            return f"There is no harness '{harness}'.{meant} Harnesses: {', '.join(harnesses)}."
        if not pattern:
            return ""
        pool = [t for t in self.tasks if not harness or t.harness == harness]
        near = [t.qualified_name for t in pool if _squashed(pattern) in _squashed(t.qualified_name)]
        near = near or close_matches(pattern, [t.qualified_name for t in pool] + [t.name for t in pool], n=5)
        where = f" of {harness}" if harness else ""
        if near:
            shown = ", ".join(near[:5]) + (f" (+{len(near) - 5} more)" if len(near) > 5 else "")
            return f"No task{where} has '{pattern}' in its name; close: {shown}."
        return f"No task{where} has '{pattern}' in its name; `evaluate tasks` lists them all."


def _squashed(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum())


def catalog_path() -> Path:
    """Where the launcher's task definitions live (without importing the launcher)."""
    spec = importlib.util.find_spec(LAUNCHER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EvaluationError(
            "nemo-evaluator-launcher is not installed, so there is no task catalog.",
            hint="Install ckpteval with its dependencies (`uv sync`).",
        )
    return Path(next(iter(spec.submodule_search_locations))) / CATALOG_FILE


@functools.cache
def load_catalog(path: Path | None = None) -> Catalog:
    """Parse the launcher's catalog (about 0.2 s; cached per process)."""
    import yaml

    source = path or catalog_path()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with source.open(encoding="utf-8") as fh:
        data = yaml.load(fh, Loader=loader)
    harnesses = {h["name"]: h for h in data.get("harnesses", [])}
    tasks = []
    for raw in data.get("tasks", []):
        defaults = raw.get("defaults", {})
        config = defaults.get("config", {})
        harness = harnesses.get(raw["harness"], {})
        params = dict(config.get("params") or {})
        command = defaults.get("command", "")
        eval_type = config.get("type", raw["name"])
        tasks.append(
            TaskSpec(
                name=raw["name"],
                harness=raw["harness"],
                description=" ".join(str(raw.get("description") or "").split()),
                container=harness.get("container", ""),
                endpoint_types=tuple(config.get("supported_endpoint_types") or ()),
                capabilities=tuple(config.get("required_capabilities") or ()),
                command=command,
                params=params,
                eval_type=eval_type,
                framework_name=defaults.get("framework_name", raw["harness"]),
                pkg_name=defaults.get("pkg_name", ""),
                target_defaults=dict(defaults.get("target") or {}),
                judge=judge_use(raw["harness"], eval_type, params, command),
            )
        )
    return Catalog(tasks=tuple(tasks), source=source)
