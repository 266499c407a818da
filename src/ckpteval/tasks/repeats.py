"""Repeated sampling of a task: k runs of the same harness task, each with its own seed and output dir.

`evaluation.tasks[].repeats: k` (or `-t gsm8k:k`) runs the task's client k times, exactly as a greedy
task runs once (same nemo-evaluator run config, same lm-eval task, prompts, filters and metrics), except:

- run i writes into `output-rs<i>/` (its own response cache, lm-eval cache and samples), logs to
  `client-rs<i>.log` and is marked done by `output-rs<i>/.done`, so an interrupted task resumes at the
  first unfinished repeat, and inside that repeat from its cache (no answered request is sent again);
- every request of run i carries `seed: i`, added to the request body by nemo-evaluator's
  `payload_modifier` interceptor (lm-eval sends the same `seed: 1234` in every request, so without it a
  seeded server would answer all k runs alike);
- sampling: a task whose default is greedy (the catalog spells it temperature 1e-07) is sampled at
  temperature 0.7, top_p 0.95 (NeMo-Skills' values for `:N`) unless the config sets them.

Why k client runs rather than lm-eval's own `repeats`: lm-eval repeats a document by sending the same
request k times; identical bodies (same seed) get identical answers from a seeded server and are
replayed by the response cache, and a task's repeats can only be changed by rewriting its YAML.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckpteval.errors import ConfigError

SAMPLING_TEMPERATURE = 0.7
SAMPLING_TOP_P = 0.95
# Catalog tasks spell greedy decoding as a tiny temperature (gsm8k: 1e-07) rather than 0.
GREEDY_TEMPERATURE = 1e-5
DONE_MARKER = ".done"
# tasks/<dir>/repeats: the number of samples per problem of a repeated task (absent for a greedy task)
REPEATS_FILE = "repeats"


@dataclass(frozen=True)
class RunLayout:
    """Where one client run of a task keeps its files, relative to the task dir.

    `repeat` is None for a task's only run (greedy: `output/`, `run_config.yml`, `client.log`), else the
    repeat's index, which is also its seed.
    """

    repeat: int | None = None

    @property
    def output(self) -> str:
        return "output" if self.repeat is None else f"output-rs{self.repeat}"

    @property
    def run_config(self) -> str:
        return "run_config.yml" if self.repeat is None else f"run_config-rs{self.repeat}.yml"

    @property
    def log(self) -> str:
        return "client.log" if self.repeat is None else f"client-rs{self.repeat}.log"

    @property
    def done(self) -> str:
        """The marker of a finished repeat (a greedy run is marked by the task's own `.done`)."""
        return f"{self.output}/{DONE_MARKER}"

    @property
    def seed(self) -> int | None:
        return self.repeat


def run_layouts(repeats: int) -> tuple[RunLayout, ...]:
    """The client runs of a task with `repeats` samples per problem (0: one greedy run)."""
    if repeats < 0:
        raise ValueError(f"repeats must not be negative, not {repeats}")
    if repeats == 0:
        return (RunLayout(),)
    return tuple(RunLayout(i) for i in range(repeats))


def current_log(layouts: Sequence[RunLayout], started: Callable[[str], bool]) -> str:
    """The client log (relative to the task dir) to show for a task: its newest run whose log exists
    (`started(relative path)`), or the first run's when none has started. A greedy task has one run.

    The same answer on this machine (`started` checks the job dir) and on a cluster (`started` asks
    the remote, or a snapshot of the task dir), so no caller spells a repeat's log name itself."""
    if not layouts:
        raise ValueError("a task has at least one run")
    begun = [layout.log for layout in layouts if started(layout.log)]
    return begun[-1] if begun else layouts[0].log


def read_repeats(text: str | None) -> int:
    """The samples per problem recorded in a task dir's `repeats` file (0 when there is none)."""
    try:
        return max(0, int((text or "0").strip() or 0))
    except ValueError:
        return 0


@dataclass(frozen=True)
class SamplingChoice:
    """The params a repeated task samples with (updates ckpteval chose, if any), and a line for the preview."""

    params: dict[str, Any]  # launcher-shaped config.params updates (temperature, top_p); {} when none
    note: str | None


def sampling_params(
    task: str, repeats: int, *, task_defaults: Mapping[str, Any], user: Mapping[str, Any]
) -> SamplingChoice:
    """Temperature and top_p for `repeats` samples per problem.

    `task_defaults` are the catalog task's params, `user` the config's (global < task, unset removed).
    The user's values always win. A task whose default temperature is greedy gets
    SAMPLING_TEMPERATURE / SAMPLING_TOP_P, since k greedy answers would be one answer k times.
    """
    if repeats == 0:
        return SamplingChoice({}, None)
    head = f"{task}: {repeats} sample{'s' if repeats > 1 else ''} per problem"
    temperature = user.get("temperature", task_defaults.get("temperature"))
    greedy = temperature is None or float(temperature) <= GREEDY_TEMPERATURE
    if "temperature" in user or not greedy:
        top_p = user.get("top_p", task_defaults.get("top_p"))
        shown = f" at temperature {temperature}" + (f", top_p {top_p}" if top_p is not None else "")
        warning = " (greedy: expect the same answer in every repeat)" if greedy else ""
        return SamplingChoice({}, head + shown + warning)
    params: dict[str, Any] = {"temperature": SAMPLING_TEMPERATURE}
    if "top_p" not in user:
        params["top_p"] = SAMPLING_TOP_P
    shown = ", ".join(f"{k} {params.get(k, user.get(k))}" for k in ("temperature", "top_p"))
    return SamplingChoice(
        params,
        f"{head} at {shown} (the task's default is greedy; set temperature/top_p in the task's "
        "nemo_evaluator_config to choose)",
    )


def with_request_params(adapter_config: dict[str, Any], request_params: Mapping[str, Any]) -> dict[str, Any]:
    """`adapter_config` with a `payload_modifier` first in its interceptor chain that adds
    `request_params` (the repeat's seed, top_k, ...) to every request body.

    First, so the caching interceptor's key and the logged requests include them; a user's own
    payload_modifier later in the chain still wins for the keys it sets.
    """
    if not request_params:
        return copy.deepcopy(adapter_config)
    interceptors = adapter_config.get("interceptors")
    if not isinstance(interceptors, list):
        raise ConfigError(
            "Request params (a repeat's seed, top_k) need an interceptor chain, but the task's adapter_config "
            "uses nemo-evaluator's legacy flags.",
            hint="List the chain under adapter_config.interceptors (see docs/tasks.md), or drop the legacy flags.",
        )
    modifier = {"name": "payload_modifier", "config": {"params_to_add": dict(request_params)}}
    out = copy.deepcopy(adapter_config)
    out["interceptors"] = [modifier, *copy.deepcopy(interceptors)]
    return out
