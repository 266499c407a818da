"""`compile_config`: from a command line to one typed, validated `CompiledConfig`.

compose (Hydra, profile, overrides, -t) -> type (dataclasses) -> check what types cannot express
(tasks against the catalog, endpoint capabilities, parallelism, checkpoint presence).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.config.compose import CompileRequest, Mode, compose
from ckpteval.config.profiles import Profile
from ckpteval.config.schema import (
    EvalConfig,
    LocalExecution,
    MegatronDeployment,
    NemoEvaluatorConfig,
    NoDeployment,
    SlurmExecution,
)
from ckpteval.config.secrets import SecretValues
from ckpteval.config.typed import from_mapping
from ckpteval.errors import ConfigError
from ckpteval.tasks.catalog import Catalog, TaskSpec, load_catalog


@dataclass(frozen=True)
class ResolvedTask:
    """One task of an invocation: its catalog entry and its effective settings."""

    index: int
    name: str  # as written in the config
    spec: TaskSpec
    dir_name: str  # unique, filesystem-safe: where its output goes inside the invocation dir
    endpoint_type: str
    evaluator_config: dict[str, Any]  # launcher-shaped, global merged with the task's own (task wins)
    container: str
    env_vars: dict[str, str]
    repeats: int  # 0: one greedy run; k: k sampled runs with seeds 0..k-1 (see ckpteval.tasks.repeats)
    dataset_dir: str | None
    request_params: dict[str, Any] = field(default_factory=dict)  # added to every request body
    sampling_note: str | None = None  # repeated tasks: samples per problem, temperature, who chose it


@dataclass(frozen=True)
class CompiledConfig:
    """A compiled invocation config: typed, validated, with where every piece came from."""

    config: EvalConfig
    data: dict[str, Any]  # the resolved config as plain data (what the preview prints and we save)
    tasks: tuple[ResolvedTask, ...]
    profile: Profile
    request: CompileRequest
    env_file: Path | None
    config_files: tuple[Path, ...]
    secrets: SecretValues
    notes: tuple[str, ...] = ()

    @property
    def mode(self) -> Mode:
        return self.request.mode

    @property
    def execution_type(self) -> str:
        return self.config.execution.type


def compile_config(request: CompileRequest, *, catalog: Catalog | None = None) -> CompiledConfig:
    """Compose, type and validate the config a request describes. Raises ConfigError on bad input."""
    composed = compose(request)
    data = composed.data
    notes: list[str] = [
        f"task '{n}' is not in the config's task list; -t added it with the global settings"
        for n in composed.added_tasks
    ]
    notes.extend(
        f"run.model {a.ref.qualified} -> {a.path} (W&B artifact {a.version}, {a.rule})" for a in composed.artifacts
    )
    notes.extend(_settle_backend(data))
    _check_deployment_keys(data)
    config = from_mapping(EvalConfig, data, where="config")
    catalog = catalog or load_catalog()
    tasks = resolve_tasks(config, data, catalog)
    check_config(config, tasks, cwd=request.cwd)
    notes.extend(t.sampling_note for t in tasks if t.sampling_note)
    return CompiledConfig(
        config=config,
        data=data,
        tasks=tasks,
        profile=composed.profile,
        request=request,
        env_file=composed.env.path,
        config_files=composed.config_files,
        secrets=composed.secrets,
        notes=tuple(notes),
    )


def _settle_backend(data: dict[str, Any]) -> list[str]:
    """`backend: auto` means builtin on this machine and export-deploy on a cluster."""
    deployment = data.get("deployment") or {}
    if deployment.get("type") != "megatron" or deployment.get("backend") != "auto":
        return []
    chosen = "builtin" if (data.get("execution") or {}).get("type") == "local" else "export-deploy"
    deployment["backend"] = chosen
    return [f"deployment.backend auto -> {chosen}"]


def _check_deployment_keys(data: dict[str, Any]) -> None:
    """A key meant for another deployment type (left by a stage config after `deployment=...`) gets a
    message that says so, rather than a bare "unknown key"."""
    import dataclasses

    from ckpteval.config.schema import DEPLOYMENT_TYPES

    deployment = data.get("deployment") or {}
    schema = DEPLOYMENT_TYPES.get(str(deployment.get("type")))
    if schema is None:
        return
    own = {f.name for f in dataclasses.fields(schema)}
    for key in deployment:
        if key in own:
            continue
        owners = [t for t, cls in DEPLOYMENT_TYPES.items() if key in {f.name for f in dataclasses.fields(cls)}]
        if owners:
            raise ConfigError(
                f"deployment.{key} belongs to deployment type {'/'.join(owners)}, "
                f"but deployment.type is '{deployment['type']}'.",
                hint=f"A config set deployment.{key} for another deployment; remove it with ~deployment.{key}, "
                "or put deployment settings in a deployment group config (conf/deployment/*.yaml).",
            )


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `top` merged in, key by key (top wins; nested mappings merge)."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _drop_unset_params(cfg: dict[str, Any]) -> dict[str, Any]:
    """Remove params left null: null means "the task's own default" (the catalog's, e.g. hellaswag's
    temperature), so a global `temperature: null` must not override it."""

    def prune(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: prune(v) for k, v in node.items() if v is not None}
        return node

    params = (cfg.get("config") or {}).get("params")
    if isinstance(params, dict):
        cfg = copy.deepcopy(cfg)
        pruned = prune(params)
        extra = pruned.get("extra")
        # A tokenizer backend with no tokenizer (deployment none/generic without one) would make lm-eval
        # load a tokenizer named after the served model from the hub; leave both to the task's default.
        if isinstance(extra, dict) and "tokenizer" not in extra and extra.get("tokenizer_backend") == "huggingface":
            del extra["tokenizer_backend"]
        cfg["config"]["params"] = pruned
    return cfg


def _dir_name(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    candidate, n = base, 1
    while candidate in taken:
        candidate = f"{base}.{n}"
        n += 1
    taken.add(candidate)
    return candidate


def resolve_tasks(config: EvalConfig, data: dict[str, Any], catalog: Catalog) -> tuple[ResolvedTask, ...]:
    """Each configured task with its catalog entry and merged nemo-evaluator settings (a repeated task
    whose default is greedy gets a sampling temperature here, see `ckpteval.tasks.repeats`)."""
    from ckpteval.tasks.repeats import sampling_params

    global_cfg = (data.get("evaluation") or {}).get("nemo_evaluator_config") or {}
    raw_tasks = (data.get("evaluation") or {}).get("tasks") or []
    taken: set[str] = set()
    out = []
    for index, (task, raw) in enumerate(zip(config.evaluation.tasks, raw_tasks, strict=True)):
        spec = catalog.get(task.name)
        merged = _drop_unset_params(deep_merge(global_cfg, raw.get("nemo_evaluator_config") or {}))
        # validate the merged shape too (a task-level typo is caught with its path)
        from_mapping(
            NemoEvaluatorConfig, merged, where="config", path=f"evaluation.tasks[{index}].nemo_evaluator_config"
        )
        user_params = (merged.get("config") or {}).get("params") or {}
        choice = sampling_params(task.name, task.repeats, task_defaults=spec.params, user=user_params)
        if choice.params:
            merged = deep_merge(merged, {"config": {"params": choice.params}})
        endpoint_type = task.endpoint_type or _default_endpoint_type(config, spec)
        out.append(
            ResolvedTask(
                index=index,
                name=task.name,
                spec=spec,
                dir_name=_dir_name(spec.name, taken),
                endpoint_type=endpoint_type,
                evaluator_config=merged,
                container=task.container or spec.container,
                env_vars={**config.evaluation.env_vars, **task.env_vars},
                repeats=task.repeats,
                dataset_dir=task.dataset_dir,
                request_params=dict(task.request_params),
                sampling_note=choice.note,
            )
        )
    return tuple(out)


def _default_endpoint_type(config: EvalConfig, spec: TaskSpec) -> str:
    wanted = config.target.api_endpoint.type
    return wanted if wanted in spec.endpoint_types or not spec.endpoint_types else spec.default_endpoint_type


_ROUTES = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def endpoint_url_for(config: EvalConfig, endpoint_type: str) -> str:
    """With `deployment: none`, the URL a task of `endpoint_type` talks to: `target.api_endpoint.url` for
    tasks of the endpoint's own type; for the other type, the same server's other OpenAI route
    (`.../v1/completions` <-> `.../v1/chat/completions`)."""
    api = config.target.api_endpoint
    url = api.url or ""
    if endpoint_type == api.type:
        return url
    own, wanted = _ROUTES[api.type], _ROUTES[endpoint_type]
    base = url.rstrip("/")
    if not base.endswith(own):
        raise ConfigError(
            f"A task needs a {endpoint_type} endpoint, but target.api_endpoint.url ({url}) is a {api.type} URL "
            f"that does not end in {own}, so its {endpoint_type} route is unknown.",
            hint=f"Use an URL ending in {own}, or evaluate {endpoint_type} tasks in a separate invocation "
            f"with target.api_endpoint.type={endpoint_type}.",
        )
    return base[: -len(own)] + wanted


def check_config(config: EvalConfig, tasks: tuple[ResolvedTask, ...], *, cwd: Path) -> None:
    """Semantic checks the types cannot express; the first failure is a ConfigError naming the fix."""
    if not tasks:
        raise ConfigError(
            "No tasks to evaluate.", hint="Use a stage config that lists tasks (-c sft), or name tasks with -t."
        )
    _check_tasks(config, tasks)
    _check_deployment(config, tasks, cwd=cwd)
    _check_export(config)


def _check_export(config: EvalConfig) -> None:
    """W&B needs a project to put the run in; without one it would land in "uncategorized"."""
    import os

    wandb = config.export.wandb
    if wandb.enabled and not wandb.project and not os.environ.get("WANDB_PROJECT"):
        raise ConfigError(
            "export.wandb is enabled but no W&B project is set.",
            hint='Set project in env.toml [wandb] (project = "evals"), or export.wandb.project=NAME, '
            "or $WANDB_PROJECT; or turn the export off with export.wandb.enabled=false.",
        )


def _check_tasks(config: EvalConfig, tasks: tuple[ResolvedTask, ...]) -> None:
    parallel = config.evaluation.max_parallel_tasks
    if parallel is not None and parallel < 1:
        raise ConfigError(
            f"evaluation.max_parallel_tasks must be at least 1, not {parallel}.",
            hint="Use 1 to run tasks one after another, or null for all at once (at most 8).",
        )
    for task in tasks:
        where = f"evaluation.tasks[{task.index}] ({task.name})"
        spec = task.spec
        if spec.endpoint_types and task.endpoint_type not in spec.endpoint_types:
            supported = ", ".join(spec.endpoint_types)
            raise ConfigError(
                f"{where}: the task supports {supported} endpoints, not '{task.endpoint_type}'.",
                hint=f"Set evaluation.tasks.{task.index}.endpoint_type={spec.endpoint_types[0]}.",
            )
        if spec.needs_logprobs and task.endpoint_type == "chat":
            raise ConfigError(
                f"{where}: the task scores answers by log-probabilities, which a chat endpoint does not give.",
                hint="Evaluate it against a completions endpoint (endpoint_type=completions).",
            )
        params = (task.evaluator_config.get("config") or {}).get("params") or {}
        extra = params.get("extra") or {}
        if spec.needs_logprobs and spec.harness == "lm-evaluation-harness" and not extra.get("tokenizer"):
            raise ConfigError(
                f"{where}: log-likelihood tasks need the model's tokenizer (nvidia-lm-eval counts tokens itself).",
                hint="Set evaluation.nemo_evaluator_config.config.params.extra.tokenizer to an HF tokenizer "
                "dir or id (with deployment: none, set deployment.tokenizer).",
            )
        limit = params.get("limit_samples")
        if limit is not None and limit <= 0:
            raise ConfigError(f"{where}: limit_samples must be positive, not {limit}.")
        if task.repeats < 0:
            raise ConfigError(f"{where}: repeats must be 0 (greedy) or a positive number of samples.")
        if task.repeats > 0 and spec.needs_logprobs:
            raise ConfigError(
                f"{where}: the task scores answers by log-probabilities, which sampling does not change; "
                f"repeats ({task.repeats}) only make sense for tasks that generate answers.",
                hint=f"Evaluate {task.name} once (no :K suffix, repeats: 0).",
            )


def _check_deployment(config: EvalConfig, tasks: tuple[ResolvedTask, ...], *, cwd: Path) -> None:
    deployment = config.deployment
    execution = config.execution
    if isinstance(deployment, NoDeployment):
        if not config.target.api_endpoint.url:
            raise ConfigError(
                "deployment: none evaluates an endpoint that already runs, but no URL is set.",
                hint="Set target.api_endpoint.url=http://HOST:PORT/v1/completions.",
            )
        for task in tasks:
            endpoint_url_for(config, task.endpoint_type)
        return
    if not isinstance(deployment, MegatronDeployment):
        if isinstance(execution, LocalExecution):
            raise ConfigError(
                f"deployment: {deployment.type} runs a container image; this machine runs no containers.",
                hint="Evaluate on a Slurm profile (--run/--batch PROFILE), or serve the model yourself and use "
                "deployment=none target.api_endpoint.url=...",
            )
        return
    tp = deployment.tensor_model_parallel_size
    pp = deployment.pipeline_model_parallel_size
    ep = deployment.expert_model_parallel_size
    for key, value in (
        ("tensor_model_parallel_size", tp),
        ("pipeline_model_parallel_size", pp),
        ("expert_model_parallel_size", ep),
    ):
        if value < 1:
            raise ConfigError(f"deployment.{key} must be at least 1, not {value}.")
    if deployment.num_gpus < 0:
        raise ConfigError(f"deployment.num_gpus must not be negative, not {deployment.num_gpus}.")
    if deployment.backend == "builtin":
        if tp * pp > 1:
            raise ConfigError(
                f"The builtin server runs on one device; it cannot shard the model (TP={tp}, PP={pp}).",
                hint="Use deployment.backend=export-deploy on a cluster for TP/PP > 1.",
            )
    else:
        gpus = deployment.num_gpus
        if isinstance(execution, LocalExecution):
            raise ConfigError(
                "deployment.backend=export-deploy runs in the NeMo container on GPUs, which this machine lacks.",
                hint="Use deployment.backend=builtin here, or --run/--batch a Slurm profile.",
            )
        if gpus == 0 or gpus % (tp * pp) != 0:
            raise ConfigError(
                f"TP×PP = {tp}×{pp} = {tp * pp} does not divide deployment.num_gpus={gpus}.",
                hint="Choose tensor/pipeline parallel sizes whose product divides the GPU count.",
            )
        if gpus % ep != 0:
            raise ConfigError(f"deployment.expert_model_parallel_size={ep} does not divide num_gpus={gpus}.")
        if isinstance(execution, SlurmExecution):
            available = execution.gpus_per_node * deployment.num_nodes
            if gpus > available:
                raise ConfigError(
                    f"deployment.num_gpus={gpus} is more than {deployment.num_nodes} node(s) × "
                    f"{execution.gpus_per_node} GPUs.",
                    hint="Raise deployment.num_nodes (and the profile's nodes) or lower num_gpus.",
                )
    if isinstance(execution, LocalExecution) and deployment.prepare is None:
        path = Path(deployment.checkpoint_path).expanduser()
        path = path if path.is_absolute() else cwd / path
        if not path.exists():
            raise ConfigError(
                f"Checkpoint {deployment.checkpoint_path} does not exist.",
                hint="Pass run.model=/path/to/checkpoint (a Megatron checkpoint dir), or "
                "`evaluate prepare smollm2` to make one.",
            )
    if isinstance(execution, SlurmExecution) and deployment.backend == "export-deploy" and not deployment.image:
        raise ConfigError(
            "deployment.backend=export-deploy needs the NeMo container image.",
            hint="Set container_image in the env.toml profile, or deployment.image=...",
        )
