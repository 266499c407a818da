"""Which tasks may run at once against a server that batches requests of different clients together.

Export-Deploy 0.5+ (`serve.batch` in its Ray deployment, NVIDIA-NeMo/Export-Deploy#629) puts the requests
that arrive within `--batch_wait_timeout_s` of each other into one batch, whichever client sent them, and
runs that batch with the *first* request's settings: temperature, top_k, top_p, max tokens, whether to
compute log-probabilities (and how many top ones), echo, stop words. Completions and chat requests wait in
separate queues. Two tasks sharing such a deployment at once would each get answers made with the other's
settings, silently (docs/deploy.md, "Concurrent tasks", has the finding per release, with file and lines).

So on such a release tasks run in groups, one group after the other: a group holds tasks whose requests
carry the same settings (`RequestSettings`), at most one such set per endpoint route. Tasks in one group run
side by side as usual (`evaluation.max_parallel_tasks`); a deployment that does not batch across clients
keeps one group of everything.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ckpteval.job.plan import JobPlan

# request fields a run adds that Export-Deploy's batch never reads (it is seeded once, at start-up)
_IGNORED_REQUEST_PARAMS = frozenset({"seed"})


@dataclass(frozen=True)
class RequestSettings:
    """The settings every request of one task carries, as far as a batch's first request imposes them.

    Log-likelihood tasks: lm-eval sends the same fixed settings for every such request (temperature 0,
    max_tokens 1, logprobs 1, echo), whatever the task's params say, so they all share one set. Generation
    tasks: the task's temperature, top_p, max_new_tokens, and its harness task, whose own definition gives
    the stop sequences (ckpteval cannot see them before the harness runs, so two different harness tasks
    never count as the same). `extra`: request fields the config adds to every request (top_k, ...).
    """

    route: str  # completions | chat: Export-Deploy batches each route in its own queue
    kind: Literal["loglikelihood", "generation"]
    task: str = ""  # the harness task (generation only)
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    extra: str = ""  # request_params but the seed, as sorted JSON

    @classmethod
    def of(
        cls,
        *,
        route: str,
        logprobs: bool,
        params: Mapping[str, Any],
        request_params: Mapping[str, Any] | None = None,
    ) -> RequestSettings:
        """The settings of a task against `route` with nemo-evaluator `params` (the run config's
        `config.params`) and `request_params` (added to every request body)."""
        extra = {k: v for k, v in (request_params or {}).items() if k not in _IGNORED_REQUEST_PARAMS}
        extra_json = json.dumps(extra, sort_keys=True, default=str) if extra else ""
        if logprobs:
            return cls(route=route, kind="loglikelihood", extra=extra_json)
        return cls(
            route=route,
            kind="generation",
            task=str(params.get("task") or ""),
            temperature=params.get("temperature"),
            top_p=params.get("top_p"),
            max_new_tokens=params.get("max_new_tokens"),
            extra=extra_json,
        )

    def describe(self) -> str:
        """A few words for the dry run and the job log."""
        if self.kind == "loglikelihood":
            words = [f"log-likelihood ({self.route})"]
        else:
            words = [f"generation of {self.task or '?'} ({self.route})"]
            for name in ("temperature", "top_p", "max_new_tokens"):
                value = getattr(self, name)
                if value is not None:
                    words.append(f"{name} {value}")
        if self.extra:
            words.append(f"request params {self.extra}")
        return ", ".join(words)


def task_groups(settings: Sequence[RequestSettings | None]) -> tuple[tuple[int, ...], ...]:
    """Task indexes in groups to run one after another, so that no two tasks with different settings on
    the same route run at once; tasks with the same settings stay together, and a group takes one set
    of settings per route (a completions task and a chat task never share a queue).

    A task with settings None (nothing known) is a group of its own. Order: by each group's first task.
    """
    by_route: dict[str, dict[RequestSettings, list[int]]] = {}
    alone: list[list[int]] = []
    for index, s in enumerate(settings):
        if s is None:
            alone.append([index])
        else:
            by_route.setdefault(s.route, {}).setdefault(s, []).append(index)
    # the i-th set of settings of every route runs in the i-th group
    columns = [list(sets.values()) for sets in by_route.values()]
    groups = [
        sorted(i for column in columns if n < len(column) for i in column[n])
        for n in range(max((len(c) for c in columns), default=0))
    ]
    groups += alone
    return tuple(tuple(g) for g in sorted(groups, key=lambda g: g[0]))


def with_task_groups(plan: JobPlan, *, shared_batches: bool) -> JobPlan:
    """`plan` with its tasks grouped by their request settings when the deployment puts requests of different
    clients into one batch (`shared_batches`), else in one group."""
    groups = task_groups([t.settings for t in plan.tasks]) if shared_batches else ()
    return dataclasses.replace(plan, task_groups=groups if len(groups) > 1 else ())


def describe_groups(plan: JobPlan) -> list[str]:
    """One line per group of a plan whose tasks run in groups: the tasks and their request settings."""
    if not plan.task_groups:
        return []
    n = len(plan.task_groups)
    lines = []
    for k, group in enumerate(plan.task_groups, 1):
        tasks = [plan.tasks[i] for i in group]
        settings = dict.fromkeys(t.settings.describe() if t.settings else "settings unknown" for t in tasks)
        lines.append(f"group {k} of {n}: {', '.join(t.name for t in tasks)} ({'; '.join(settings)})")
    return lines
