"""Which tasks are scored by a judge model, and how each harness is told which judge.

From the launcher's own task definitions (nemo-evaluator-launcher 0.2.6's catalog): a task whose
`config.params.extra` has `judge_support` (NeMo-Skills) needs a judge when it is true; one with an
`extra.judge` section whose `enabled` is false (tau2-bench) can use one; simple-evals gives every task an
`extra.judge` section but only some of its evals call it (the table below, read from nvidia-simple-evals
26.3's `__main__`); any other task with an `extra.judge` section, or whose command passes `--judge` flags,
needs one. Without a judge of ours such a task calls its harness's default (a hosted gpt-4 for MT-Bench):
a score of an unnamed judge, or no score at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# simple-evals' evals that grade with a judge (its equality checker or grader); the others ignore one
SIMPLE_EVALS_JUDGED = frozenset(
    {
        "math_test_500",
        "AIME_2024",
        "AA_math_test_500",
        "AA_AIME_2024",
        "AIME_2025",
        "AIME_2025_aa_v2",
        "simpleqa",
        "browsecomp",
        "healthbench",
        "healthbench_hard",
        "healthbench_consensus",
    }
)

# The key under `config.params.extra.judge` that holds the *name* of the environment variable with the
# judge's API key: MT-Bench's command reads `api_key_name`, every other harness's `api_key`.
_API_KEY_NAME_KEY = {"mtbench": "api_key_name"}


@dataclass(frozen=True)
class JudgeUse:
    """How a task uses a judge. `required`: it cannot be scored without one; else it can use one.
    `fillable`: its harness takes an OpenAI-compatible URL and model id under `config.params.extra.judge`
    (`url`, `model_id`, and `api_key_key`: the name of the variable holding the key), which ckpteval fills
    from the configured judge; else (VLMEvalKit's `judge.model`) only the user's own values tell it."""

    required: bool
    fillable: bool = True
    api_key_key: str = "api_key"
    route: str = ""  # appended to the judge's base URL (`.../v1`): "/chat/completions" where the harness wants it


@dataclass(frozen=True)
class JudgeEndpoint:
    """The judge a task's harness is told about: an OpenAI-compatible base URL (`.../v1`), the model id it
    serves, and the NAME of the variable that holds its key in the job (None: no key)."""

    url: str
    model_id: str
    api_key_env: str | None = None


def judge_params(use: JudgeUse, endpoint: JudgeEndpoint, own: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`config.params.extra.judge` for a task's harness: the endpoint's URL, model id and key variable under
    the keys it reads, with the user's own values (`own`, the task's configured `extra.judge`) winning."""
    filled: dict[str, Any] = {"url": endpoint.url.rstrip("/") + use.route, "model_id": endpoint.model_id}
    if endpoint.api_key_env:
        filled[use.api_key_key] = endpoint.api_key_env
    return {**filled, **dict(own or {})}


def judge_use(harness: str, eval_type: str, params: Mapping[str, Any], command: str) -> JudgeUse | None:
    """The judge a catalog task uses (None: none), from its harness, type, default params and command."""
    extra = params.get("extra") or {}
    judge = extra.get("judge")
    key = _API_KEY_NAME_KEY.get(harness, "api_key")
    fillable = isinstance(judge, Mapping) and "url" in judge
    default_url = str(judge.get("url") or "") if isinstance(judge, Mapping) else ""
    route = "/chat/completions" if default_url.endswith("/chat/completions") else ""
    if "judge_support" in extra:
        return JudgeUse(required=True, fillable=fillable, api_key_key=key) if extra["judge_support"] else None
    if harness == "simple_evals":
        return JudgeUse(required=True, fillable=fillable, api_key_key=key) if eval_type in SIMPLE_EVALS_JUDGED else None
    if isinstance(judge, Mapping):
        required = judge.get("enabled", True) is not False
        return JudgeUse(required=required, fillable=fillable, api_key_key=key, route=route)
    if "--judge" in command:
        return JudgeUse(required=True, fillable=False, api_key_key=key)
    return None
