"""Evaluate the model behind a training loop's router: one `evaluate` invocation per request.

A request becomes an ordinary invocation on this machine: a stage config listing its benchmarks (with
their repeats and sampling params) written into the rollout's directory, `deployment: none` pointing at
`<router_url>/v1/completions` (or `/v1/chat/completions`), the delegate's own base configs and overrides
(e.g. `limit_samples`), then the same job script, results and results.json as `evaluate` itself. So a
delegate's numbers are `evaluate`'s numbers, and `evaluate results <job_id>` shows them later.

Judged benchmarks (MT-Bench, Arena-Hard, AIME with a math judge) are scored by the judge the delegate was
started with: its own overrides (`judge=api judge.url=... judge.model_id=...`, `judge=NAME` of env.toml's
[judges], `judge=self`: the router's model) apply to every evaluation, checked as it starts
(`judge_summary`); without one a judged benchmark is answered 400 in one line. The response names the judge
and each judged benchmark's judge errors (`eval/<benchmark>/<mode>/judge_errors`).

Evaluations run one at a time (a lock; further requests wait their turn, as in slime's skills server),
each with at most `max_concurrent_requests` requests in flight toward the model (the harness's
`parallelism`). Nothing is exported: the training loop logs the returned metrics itself.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from ckpteval.config.compose import CompileRequest
from ckpteval.delegate.protocol import Benchmark, EvalRequest, flat_delegate_metrics, raw_metrics
from ckpteval.errors import EvaluationError
from ckpteval.routes import BY_ENDPOINT_TYPE

log = logging.getLogger(__name__)

ROUTES = BY_ENDPOINT_TYPE
LOG_TAIL_LINES = 200
PARAMS = "evaluation.nemo_evaluator_config.config.params"


@dataclass(frozen=True)
class DelegateSettings:
    """How the service evaluates every request."""

    output_root: Path
    model_name: str = "slime-openai-model"
    max_concurrent_requests: int = 512
    endpoint_type: Literal["completions", "chat"] = "completions"
    configs: tuple[str, ...] = ()  # base stage configs (-c), composed before the request's benchmarks
    overrides: tuple[str, ...] = ()  # Hydra overrides applied to every evaluation (e.g. limit_samples)
    env_file: Path | None = None  # the env.toml (profiles, named judges); None: the one found where it started


class EvaluationFailed(EvaluationError):
    """An evaluation ran and failed; `log_tail` is the end of its job log."""

    def __init__(self, message: str, *, log_tail: str, job_id: str) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.job_id = job_id


def benchmark_task(benchmark: Benchmark) -> dict[str, Any]:
    """The `evaluation.tasks[]` entry of one benchmark (sampling params only where the request sets them)."""
    params: dict[str, Any] = {}
    if benchmark.temperature is not None:
        params["temperature"] = benchmark.temperature
    if benchmark.top_p is not None:
        params["top_p"] = benchmark.top_p
    if benchmark.max_response_len is not None:
        params["max_new_tokens"] = benchmark.max_response_len
    task: dict[str, Any] = {"name": benchmark.name, "repeats": benchmark.repeats}
    if params:
        task["nemo_evaluator_config"] = {"config": {"params": params}}
    if benchmark.top_k is not None:
        task["request_params"] = {"top_k": benchmark.top_k}  # the harness does not send top_k itself
    return task


def request_overrides(settings: DelegateSettings, request: EvalRequest, output_dir: Path) -> tuple[str, ...]:
    """The Hydra overrides of one request's invocation: the settings' own first, then what must hold."""
    url = request.router_url + ROUTES[settings.endpoint_type]
    return (
        *settings.overrides,
        "deployment=none",
        f"target.api_endpoint.url={url}",
        f"target.api_endpoint.type={settings.endpoint_type}",
        f"target.api_endpoint.model_id={settings.model_name}",
        f"execution.output_dir={output_dir}",
        f"{PARAMS}.parallelism={settings.max_concurrent_requests}",
    )


class Delegate:
    """Runs evaluation requests, one at a time."""

    def __init__(self, settings: DelegateSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._waiting = 0
        self._count_lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Requests received and not finished (the one running included)."""
        return self._waiting

    def evaluate(self, request: EvalRequest) -> dict[str, Any]:
        """Evaluate every benchmark of `request`; the response body. ConfigError: the request names
        something that cannot be evaluated (unknown benchmark, ...); EvaluationFailed: it ran and failed."""
        if not request.benchmarks:
            return {
                "job_id": None,
                "rollout_id": request.rollout_id,
                "warning": "No benchmarks in the request; nothing was evaluated.",
                "raw_metrics": {},
                "metrics": {},
                "runs": [],
            }
        with self._count_lock:
            self._waiting += 1
        try:
            with self._lock:
                return self._evaluate(request)
        finally:
            with self._count_lock:
                self._waiting -= 1

    def _evaluate(self, request: EvalRequest) -> dict[str, Any]:
        from ckpteval.api import run
        from ckpteval.invocation.jobdir import JobDir

        rollout_dir = Path(self.settings.output_root).resolve() / f"{int(time.time())}-rollout-{request.rollout_id}"
        rollout_dir.mkdir(parents=True, exist_ok=True)
        config_path = rollout_dir / "benchmarks.yaml"
        tasks = [benchmark_task(b) for b in request.benchmarks]
        config_path.write_text(yaml.safe_dump({"evaluation": {"tasks": tasks}}, sort_keys=False))
        overrides = request_overrides(self.settings, request, rollout_dir)
        compile_request = CompileRequest(
            configs=(*self.settings.configs, str(config_path)),
            overrides=overrides,
            env_file=self.settings.env_file,
            cwd=rollout_dir,
        )
        log.info("rollout %s: evaluating %s", request.rollout_id, ", ".join(b.name for b in request.benchmarks))
        # the same `run` as `evaluate`, reporting to no one; the training loop logs the metrics, nothing is exported
        outcome = run(compile_request, export=False)
        assert outcome.record is not None and outcome.results is not None  # an attached local run
        record, results, invocation = outcome.record, outcome.results, outcome.invocation
        log.info("rollout %s: invocation %s %s", request.rollout_id, invocation, outcome.state)
        job_dir = JobDir(record.job_dir)
        job_log = job_dir.path(JobDir.JOB_LOG)
        failed = {name: o for name, o in results.tasks.items() if o.status != "succeeded"}
        if outcome.exit_status != 0 or failed:
            reasons = "; ".join(f"{name}: {o.error or o.status}" for name, o in failed.items()) or outcome.state
            raise EvaluationFailed(
                f"Evaluation {invocation} of rollout {request.rollout_id} failed ({reasons}). See {job_log}.",
                log_tail=_tail(job_log),
                job_id=invocation,
            )
        raw = {name: raw_metrics(outcome) for name, outcome in results.tasks.items()}
        task_dirs = dict(record.task_dirs)
        judge = results.provenance.judge if results.provenance else None
        return {
            "job_id": invocation,
            "rollout_id": request.rollout_id,
            # who scored the judged benchmarks (kind, model id, URL; None: no judge was configured)
            "judge": {k: judge.get(k) for k in ("kind", "model_id", "url") if judge.get(k)} if judge else None,
            "command": " ".join(record.command_line),
            "output_dir": job_dir.root,
            "log_path": str(job_log),
            "raw_metrics": raw,
            "metrics": flat_delegate_metrics(raw),
            "runs": [
                {
                    "benchmark": name,
                    "repeats": outcome.repeats,
                    "output_dir": str(job_dir.path(task_dirs[name])),
                    "duration_s": outcome.duration_s,
                }
                for name, outcome in results.tasks.items()
            ],
        }


def judge_summary(settings: DelegateSettings) -> str:
    """The judge every evaluation uses, in words, from the delegate's base configs and overrides as they
    compose (env.toml's named judges included). ConfigError: a judge section that does not type, or an API
    judge whose key variable is not set here (each evaluation would be refused)."""
    import os
    import typing

    from ckpteval.config.compose import compose
    from ckpteval.config.schema import EvalConfig
    from ckpteval.config.typed import typed_value
    from ckpteval.errors import ConfigError

    overrides = (*settings.overrides, "deployment=none", "target.api_endpoint.url=http://router.invalid/v1")
    request = CompileRequest(configs=settings.configs, overrides=overrides, env_file=settings.env_file)
    raw = compose(request).data.get("judge") or {"type": "none"}
    hint = typing.get_type_hints(EvalConfig, include_extras=True)["judge"]
    judge = typed_value(hint, raw, where="the delegate's config", path="judge")
    key = getattr(judge, "api_key_name", None)
    if key and not os.environ.get(key):
        raise ConfigError(
            f"judge.api_key_name is {key}, but ${key} is not set where the delegate runs.",
            hint=f"Export {key} with the judge's key before `evaluate serve-delegate`.",
        )
    if judge.type == "none":
        return "none (a judged benchmark is refused: start the delegate with judge=...)"
    if judge.type == "api":
        return f"api {judge.model_id} at {judge.url}"
    return judge.type + (" (the router's model judges its own answers)" if judge.type == "self" else "")


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""
