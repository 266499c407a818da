"""The refusal of a judge-scored task that has no judge, before any side effect (a dry run's too)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ckpteval.errors import ConfigError

if TYPE_CHECKING:
    from ckpteval.config.schema import EvalConfig
    from ckpteval.tasks.catalog import TaskSpec


class JudgedTask(Protocol):
    """What the check reads of a task (`config.compile.ResolvedTask`, which imports this module)."""

    @property
    def name(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def spec(self) -> TaskSpec: ...
    @property
    def evaluator_config(self) -> dict[str, Any]: ...


def check_judged_tasks(config: EvalConfig, tasks: Sequence[JudgedTask]) -> None:
    """Refuse, in one line that says what to set, a task scored by a judge model (`TaskSpec.needs_judge`) when
    the config names no judge, or names one its harness cannot be told about (it takes only its own
    `extra.judge` settings, which the task does not set)."""
    name = getattr(config.judge, "api_key_name", None)
    if name and not os.environ.get(name):
        raise ConfigError(
            f"judge.api_key_name is {name}, but ${name} is not set here: export {name} with the judge's key "
            "(it reaches the job in an owner-only file), or set judge.api_key_name=null for a judge with no key."
        )
    for task in tasks:
        use = task.spec.judge
        if use is None or not use.required:
            continue
        if config.judge.type == "none":
            raise ConfigError(
                f"Task {task.name} is scored by a judge model and no judge is set: add judge=api "
                "judge.url=URL judge.model_id=MODEL, judge=NAME (a [judges.NAME] of env.toml), or judge=self "
                "(the model judges itself)."
            )
        own = ((task.evaluator_config.get("config") or {}).get("params") or {}).get("extra", {}).get("judge")
        if not use.fillable and not own:
            raise ConfigError(
                f"Task {task.name}'s harness ({task.spec.harness}) is told its judge only by its own "
                f"settings: set evaluation.tasks[{task.index}].nemo_evaluator_config.config.params.extra.judge."
            )
