"""Which tasks may send their requests side by side: groups of tasks whose requests carry identical settings.

An endpoint that batches concurrent requests may answer a whole batch with one request's settings
(Export-Deploy 0.5+ applies the first request's max_tokens, temperature, top_k, top_p, logprobs, echo and
stop words to every request in it: docs/deploy.md). Tasks whose requests are all alike (every
log-likelihood task: echo + logprobs + max_tokens 1 at temperature 0) lose nothing by being batched
together; a log-likelihood task beside a generation task, or two generation tasks, would score another
request's settings. So the job probes the endpoint before the first request (the harness hook's
`ckpteval_settings_probe`) and, when it mixes settings, or when it is known to (an Export-Deploy entry point
of 0.5+), runs the groups planned here one after another; the tasks of a group run side by side.

A task's settings are what its harness puts in every request besides the prompt: for a log-likelihood task
lm-eval's fixed scoring request; for a generation task its sampling settings and its stop words, which the
task's own definition holds (so two different generation tasks are never grouped together). Request params
ckpteval adds (`top_k`) count; a repeat's `seed` does not (an endpoint applies no batch-wide seed, and the
repeats of a task run one after another anyway).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckpteval.job.plan import JobPlan, RequestGroups
from ckpteval.merge import deep_merge

if TYPE_CHECKING:
    from ckpteval.config.compile import ResolvedTask
    from ckpteval.config.preview import PreviewPanel

# the sampling settings a generation task's requests carry (nemo-evaluator's names for them)
_GENERATION_PARAMS = ("temperature", "top_p", "max_new_tokens")


@dataclass(frozen=True)
class RequestSettings:
    """What one task's requests carry besides the prompt: `key` is equal for tasks whose requests are alike."""

    key: str
    words: str  # for the dry run and the job log


def request_settings(task: ResolvedTask) -> RequestSettings:
    """The settings every request of `task` carries (see the module's docstring)."""
    params = deep_merge(dict(task.spec.params), dict(((task.evaluator_config.get("config") or {}).get("params")) or {}))
    added = {k: v for k, v in sorted(task.request_params.items()) if k != "seed"}
    extra = "".join(f", {k} {v}" for k, v in added.items())
    if task.spec.needs_logprobs:
        key = json.dumps(["log-likelihood", task.endpoint_type, added], sort_keys=True, default=str)
        return RequestSettings(key, f"log-likelihood (echo, logprobs, max_tokens 1, temperature 0{extra})")
    sampling = {k: params.get(k) for k in _GENERATION_PARAMS if params.get(k) is not None}
    key = json.dumps(
        ["generation", task.endpoint_type, task.spec.qualified_name, task.spec.eval_type, sampling, added],
        sort_keys=True,
        default=str,
    )
    shown = ", ".join(f"{k} {v}" for k, v in sampling.items())
    return RequestSettings(key, f"{task.name}'s generations ({shown + ', ' if shown else ''}its stop words{extra})")


def plan_groups(
    tasks: Sequence[ResolvedTask], *, parallel: int, probe: str, known_mixing: str = "", shared: bool = False
) -> RequestGroups:
    """Group `tasks` by their request settings (first appearance first). The probe runs where its answer
    could change something (two groups or more, and more than one task at a time) and, whatever the number
    of groups, against an endpoint the job does not own (`shared`: other clients may send it requests of
    other settings, which no grouping here prevents; its verdict goes into the results' provenance)."""
    keys: dict[str, list[int]] = {}
    words: dict[str, str] = {}
    for i, task in enumerate(tasks):
        settings = request_settings(task)
        keys.setdefault(settings.key, []).append(i)
        words.setdefault(settings.key, settings.words)
    groups = tuple(tuple(v) for v in keys.values())
    needed = (len(groups) > 1 and parallel > 1) or shared
    return RequestGroups(
        groups=groups,
        words=tuple(words[k] for k in keys),
        probe=probe if needed else "",
        known_mixing=known_mixing if needed else "",
        shared=shared,
    )


def probe_command(
    python: str, hook_dir: str, *, urls: dict[str, str], model_id: str, api_key_name: str | None, out: str
) -> str:
    """The shell command that runs the probe (standard library only: any python3 runs it). A URL on the port
    the deployment publishes at run time (`${DEPLOY_PORT}`) is a double-quoted word, expanded by the job."""
    argv = [python, f"{hook_dir.rstrip('/')}/ckpteval_settings_probe.py", "--model", model_id, "--out", out]
    if api_key_name:
        argv += ["--api-key-env", api_key_name]
    words = [shlex.join(argv)]
    for kind, url in sorted(urls.items()):
        word = f'"{url}"' if "${DEPLOY_PORT}" in url and not any(c in url for c in '"`\\') else shlex.quote(url)
        words += [f"--{kind}", word]
    return " ".join(words)


def describe(groups: RequestGroups, names: Sequence[str]) -> str:
    """The dry run's words for the plan (`names`: the plan's task names): paragraphs on one line each, for
    the front end to wrap at its width."""
    listing = "\n".join(
        f"  group {g}: {', '.join(names[i] for i in group)} — {words}"
        for g, (group, words) in enumerate(zip(groups.groups, groups.words, strict=True), 1)
    )
    if groups.shared:
        listing += (
            "\nThe job does not own this endpoint (others may send it requests): before"
            "\nany task's first request it probes whether the endpoint answers each request"
            "\nwith its own settings and records the verdict in results.json; an answer"
            "\nwith another request's settings (a generation with its prompt echoed) is an"
            "\nerror, not scored."
        )
    if len(groups.groups) <= 1:
        if groups.shared:
            return f"Every task sends requests with the same settings: they run side by side.\n{listing}"
        return f"Every task sends requests with the same settings: they run side by side, no probe.\n{listing}"
    if not groups.probe:
        return f"Tasks run one at a time (evaluation.max_parallel_tasks=1): no request meets another task's.\n{listing}"
    if groups.known_mixing:
        return (
            f"The endpoint mixes request settings across a batch: {groups.known_mixing}.\n"
            "So the tasks run in these groups of identical request settings, one group after another (a group's "
            f"tasks side by side). The job still probes the endpoint first and logs what it finds.\n{listing}"
        )
    return (
        "Before any task's first request, the job probes the endpoint: concurrent requests with different "
        "settings, each answer compared with the same request sent alone. If the endpoint mixes settings "
        "across a batch, the tasks run in these groups, one group after another; else all side by side.\n" + listing
    )


def requests_in_words(mark: str) -> str:
    """How the tasks' requests went, from the job's mark (`state/requests`: `side by side: <probe's verdict>`,
    `in N groups, one after another: <why>`, `one group ...: <verdict>`), as a sentence for `evaluate status`."""
    how, _, why = mark.partition(": ")
    verdict, _, seen = why.partition(": ")
    if how == "side by side" and verdict == "honoured":
        return f"side by side; the endpoint answered each with its own settings (probe: {seen})"
    if how.startswith("in ") and "groups" in how:
        return f"{how.removeprefix('in ').replace('groups,', 'groups of identical settings,')}, as {why}"
    if how.startswith("one group"):
        return f"side by side, all with the same settings (a shared endpoint); probe: {why}"
    return mark


def request_groups_panel(plan: JobPlan) -> PreviewPanel | None:
    """The dry run's panel on how the tasks' requests go (None: no grouping planned)."""
    from ckpteval.config.preview import PreviewPanel

    if plan.requests is None or (len(plan.requests.groups) <= 1 and not plan.requests.shared):
        return None  # nothing to say: every request alike, to an endpoint of the job's own
    body = describe(plan.requests, [t.name for t in plan.tasks])
    return PreviewPanel(title="request settings", body=body)
