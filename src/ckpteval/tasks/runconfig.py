"""The run config `nemo-evaluator run_eval --run_config FILE` reads for one task.

It has the shape nemo-evaluator-launcher writes as `config_ef.yaml` inside the eval-factory container
(`config.type`, `config.output_dir`, `config.params`, `target.api_endpoint`), so the same file runs the
same harness command here (nemo-evaluator + nvidia-lm-eval installed) and on a cluster (in the task's
container). nemo-evaluator merges its own task defaults under it and renders the harness command.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import copy
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from ckpteval.errors import ConfigError
from ckpteval.merge import deep_merge
from ckpteval.routes import HEALTH
from ckpteval.tasks.catalog import TaskSpec
from ckpteval.tasks.repeats import with_request_params

# Our run config is written beside the output dir, never inside it: nemo-evaluator writes its own
# fully rendered `run_config.yml` into the output dir when the task starts.
OUTPUT_SUBDIR = "artifacts"
RUN_CONFIG_FILE = "run_config.yml"
LOG_FILE = "client.log"

# How often the progress file is refreshed while requests complete.
PROGRESS_INTERVAL_S = 0.5
# Requests/responses written to the log (the launcher's legacy default is 2); the rest go to the cache.
LOGGED_REQUESTS = 2


@dataclass(frozen=True)
class EndpointSpec:
    """The endpoint a task client talks to.

    `url` is the full URL of the completions or chat route; `api_key_name` names an environment variable
    holding the key (never the key itself). `health_url` is where the progress heartbeat goes (a GET every
    0.5 s while the task runs); it defaults to `<scheme>://<host>:<port>/v1/health` of `url`.
    """

    url: str
    model_id: str
    type: Literal["completions", "chat"]
    api_key_name: str | None = None
    health_url: str | None = None

    def heartbeat_url(self) -> str:
        """The URL the progress interceptor pings (GET)."""
        if self.health_url:
            return self.health_url
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}{HEALTH}"


@dataclass(frozen=True)
class TaskPaths:
    """Where one task's files live, under its task directory (`tasks/<name>` in a job)."""

    task_dir: Path

    @property
    def output_dir(self) -> Path:
        """nemo-evaluator's `config.output_dir` (the launcher's `artifacts/`)."""
        return self.task_dir / OUTPUT_SUBDIR

    @property
    def run_config(self) -> Path:
        """Our run config, the `--run_config` argument."""
        return self.task_dir / RUN_CONFIG_FILE

    @property
    def log(self) -> Path:
        """The client's combined stdout/stderr (written by the job script)."""
        return self.task_dir / LOG_FILE


LM_EVAL_HARNESS = "lm-evaluation-harness"

# `adapter_config` that runs the harness straight against the endpoint: nemo-evaluator starts no interceptor
# proxy (it does when a chain has an enabled interceptor; an empty list would get its legacy defaults). The
# default for lm-eval tasks: the proxy held the evaluator to about half of a fast server's capacity
# (benchmarks/harness_throughput.md), and our harness hook keeps what its chain gave at lm-eval's own HTTP
# seam (`ckpteval_responses`: response cache for resume, progress, request params, response stats).
NO_PROXY_ADAPTER_CONFIG: dict[str, Any] = {"interceptors": [{"name": "endpoint", "enabled": False}]}


def default_adapter_config(spec: TaskSpec, output_dir: str, endpoint: EndpointSpec) -> dict[str, Any]:
    """The interceptor chain a task gets unless the user gives one: none for lm-eval tasks (the harness hook
    does their caching and progress), nemo-evaluator's proxy chain for every other harness."""
    if spec.harness == LM_EVAL_HARNESS:
        return copy.deepcopy(NO_PROXY_ADAPTER_CONFIG)
    return proxy_adapter_config(output_dir, endpoint)


def runs_through_proxy(adapter_config: Mapping[str, Any]) -> bool:
    """Whether nemo-evaluator starts its interceptor proxy for `adapter_config`: an enabled interceptor or
    post-eval hook, or nemo-evaluator's legacy flags (no `interceptors` list, which it converts to a chain)."""
    interceptors = adapter_config.get("interceptors")
    if not isinstance(interceptors, list) or not interceptors:
        return True
    hooks = adapter_config.get("post_eval_hooks") or []
    enabled = [i for i in [*interceptors, *hooks] if not isinstance(i, dict) or i.get("enabled", True) is not False]
    return bool(enabled)


def client_hook_env(run_config: Mapping[str, Any], request_params: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Environment for the task client's harness hook: with no proxy in the chain, the hook keeps the
    response cache and progress in the task's output dir and sets `request_params` on every request body
    (`ckpteval_responses`). Empty when the proxy runs: its interceptors do that."""
    from ckpteval.tasks.harness_hook import ckpteval_responses as responses

    adapter = run_config["target"]["api_endpoint"].get("adapter_config") or {}
    if runs_through_proxy(adapter):
        return {}
    env = {responses.OUTPUT_ENV: str(run_config["config"]["output_dir"])}
    if request_params:
        env[responses.PARAMS_ENV] = json.dumps(dict(request_params), sort_keys=True)
    return env


def proxy_adapter_config(output_dir: str, endpoint: EndpointSpec) -> dict[str, Any]:
    """nemo-evaluator's interceptor chain for a task run through its proxy (every harness but lm-eval).

    - caching: every successful response is kept in `<output_dir>/cache` and replayed on a rerun
      (`reuse_cached_responses`), so a resumed task sends no request twice;
    - request/response logging capped at a few entries (the cache holds everything);
    - response_stats: token counts and latencies into eval_factory_metrics.json;
    - progress_tracking: `<output_dir>/progress` holds the number of requests answered by the endpoint,
      refreshed every 0.5 s (`read_progress` reads it). Its webhook is a GET of the endpoint's health URL
      (the interceptor always calls a URL; this one is cheap and exists on our servers);

    No post-eval report: it needs every request saved too (nemo-evaluator's cap on saved requests logs a
    warning per request beyond it); add `post_eval_hooks: [post_eval_report]` with a caching interceptor
    that saves requests if you want report.html.
    """
    return {
        "interceptors": [
            {"name": "request_logging", "config": {"max_requests": LOGGED_REQUESTS}},
            {
                "name": "caching",
                "config": {
                    "cache_dir": f"{output_dir}/cache",
                    "reuse_cached_responses": True,
                    "save_requests": False,
                },
            },
            {"name": "endpoint"},
            {"name": "response_stats", "config": {"cache_dir": f"{output_dir}/response_stats_cache"}},
            {"name": "response_logging", "config": {"max_responses": LOGGED_REQUESTS}},
            {
                "name": "progress_tracking",
                "config": {
                    "output_dir": output_dir,
                    "progress_tracking_url": endpoint.heartbeat_url(),
                    "request_method": "GET",
                    # never per request: the 0.5 s timer writes the file (one GET per tick at most)
                    "progress_tracking_interval": 1_000_000_000,
                    "progress_tracking_interval_seconds": PROGRESS_INTERVAL_S,
                },
            },
        ],
        "post_eval_hooks": [],
    }


def merge_adapter_config(default: dict[str, Any], user: dict[str, Any] | None) -> dict[str, Any]:
    """The user's `adapter_config` over ours.

    If the user lists `interceptors`, or uses nemo-evaluator's legacy flags (`use_caching`, ...), their
    chain is used as given: nemo-evaluator cannot mix the two forms, and a user who spells out a chain
    wants exactly that chain. Otherwise their keys (`mode`, `post_eval_hooks`, `log_failed_requests`, ...)
    are set over ours.
    """
    if not user:
        return copy.deepcopy(default)
    chain_keys = {"mode", "discovery", "interceptors", "post_eval_hooks", "endpoint_type", "log_failed_requests"}
    if "interceptors" in user or set(user) - chain_keys:
        return copy.deepcopy(user)
    return {**copy.deepcopy(default), **copy.deepcopy(user)}


def build_run_config(
    spec: TaskSpec,
    nemo_evaluator_config: dict[str, Any] | None,
    *,
    endpoint: EndpointSpec,
    output_dir: str,
    metadata: dict[str, Any] | None = None,
    request_params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run config for `spec` against `endpoint`, writing into `output_dir` (an absolute path).

    `nemo_evaluator_config` is launcher-shaped (`{"config": {"params": {...}}, "target": {"api_endpoint":
    {"adapter_config": {...}}}}`), already merged global < task by the caller. `config.params` is the
    catalog task's defaults with the user's params merged over them (nested `extra` merges key by key).
    `request_params` are added to every request body (a repeat's `seed`, `top_k`: fields the harness
    does not send itself): by a `payload_modifier` interceptor at the head of the chain when the proxy runs,
    else by the harness hook (`client_hook_env` gives it them).
    """
    if endpoint.type not in spec.endpoint_types and spec.endpoint_types:
        raise ConfigError(
            f"Task {spec.name} supports {', '.join(spec.endpoint_types)} endpoints, not {endpoint.type}.",
            hint=f"Evaluate it against a {spec.endpoint_types[0]} endpoint.",
        )
    if not os.path.isabs(output_dir):
        raise ConfigError(f"The task output directory must be an absolute path, not {output_dir!r}.")
    user = nemo_evaluator_config or {}
    user_params = ((user.get("config") or {}).get("params")) or {}
    user_endpoint = ((user.get("target") or {}).get("api_endpoint")) or {}
    params = deep_merge(spec.params, user_params)
    default = default_adapter_config(spec, output_dir, endpoint)
    adapter = merge_adapter_config(default, user_endpoint.get("adapter_config"))
    if runs_through_proxy(adapter):
        adapter = with_request_params(adapter, request_params or {})
    elif request_params and spec.harness != LM_EVAL_HARNESS:
        raise ConfigError(
            f"Task {spec.name} ({spec.harness}) needs request params ({', '.join(sorted(request_params))}: a "
            "repeat's seed, top_k) set on its requests, and only nemo-evaluator's interceptor proxy can do that "
            "for this harness, but the task's adapter_config disables every interceptor.",
            hint="Enable an interceptor in its adapter_config (or drop the adapter_config to get the default chain).",
        )
    api_endpoint = deep_merge(dict(spec.target_defaults.get("api_endpoint") or {}), {})
    api_endpoint.update(
        {
            "url": endpoint.url,
            "model_id": endpoint.model_id,
            "type": endpoint.type,
            "api_key_name": endpoint.api_key_name,
            "adapter_config": adapter,
        }
    )
    run_config: dict[str, Any] = {
        "config": {"type": spec.eval_type or spec.name, "output_dir": output_dir, "params": params},
        "target": {"api_endpoint": api_endpoint},
    }
    if metadata:
        run_config["metadata"] = copy.deepcopy(metadata)
    return run_config


def harness_command(run_config: dict[str, Any]) -> str:
    """The harness command line nemo-evaluator will run for `run_config` (its own rendering; for previews).

    Imports nemo-evaluator (about 3 s). The URL in it is the endpoint's: at run time nemo-evaluator swaps
    in its interceptor proxy's address.
    """
    from nemo_evaluator.core.input import validate_configuration

    return str(validate_configuration(copy.deepcopy(run_config)).render_command()).strip()


def write_run_config(run_config: dict[str, Any], path: str | Path) -> Path:
    """Write `run_config` as YAML to `path` (a temporary file renamed into place; never half-written)."""
    import yaml

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yaml.safe_dump(run_config, fh, sort_keys=False)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
