"""`compile_config`: from a command line to one typed, validated `CompiledConfig`.

compose (Hydra, profile, overrides, -t) -> type (dataclasses) -> check what types cannot express
(tasks against the catalog, endpoint capabilities, parallelism, checkpoint presence).
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.config.compose import CompileRequest, Mode, compose
from ckpteval.config.judge_check import check_judged_tasks
from ckpteval.config.profiles import Profile
from ckpteval.config.schema import (
    EXECUTION_TYPES,
    EvalConfig,
    Execution,
    MegatronDeployment,
    NemoEvaluatorConfig,
    NoDeployment,
)
from ckpteval.config.secrets import SecretValues
from ckpteval.config.typed import from_mapping
from ckpteval.errors import ConfigError
from ckpteval.merge import deep_merge
from ckpteval.routes import BY_ENDPOINT_TYPE, COMPLETIONS
from ckpteval.tasks.catalog import Catalog, TaskSpec, load_catalog
from ckpteval.tasks.repeats import RunLayout, run_layouts

if TYPE_CHECKING:
    from ckpteval.config.resolvers import ArtifactResolver


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

    @property
    def layouts(self) -> tuple[RunLayout, ...]:
        """The task's client runs (one greedy run, or one per repeat): where each keeps its files."""
        return run_layouts(self.repeats)


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


def compile_config(
    request: CompileRequest, *, catalog: Catalog | None = None, resolve_artifact: ArtifactResolver | None = None
) -> CompiledConfig:
    """Compose, type and validate the config a request describes. Raises ConfigError on bad input.

    `resolve_artifact` resolves `run.model` naming a model artifact (`ckpteval.compile_config` passes
    the W&B one); without it such a reference is a ConfigError."""
    catalog = catalog or load_catalog()
    composed = compose(
        request, catalog=catalog, resolve_artifact=resolve_artifact
    )  # -t names are resolved against this catalog, once
    data = composed.data
    notes: list[str] = [
        f"task '{n}' is not in the config's task list; -t added it with the global settings"
        for n in composed.added_tasks
    ]
    notes.extend(
        f"run.model {a.ref.qualified} -> {a.path} (W&B artifact {a.version}, {a.rule})" for a in composed.artifacts
    )
    notes.extend(_settle_backend(data))
    notes.extend(_settle_prepare(data))
    _check_deployment_keys(data)
    config = from_mapping(EvalConfig, data, where="config")
    tasks = resolve_tasks(config, data, catalog)
    check_config(config, tasks, cwd=request.cwd, profile=composed.profile)
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
    """`backend: auto` means builtin on this machine and export-deploy on a cluster (the model's deployment,
    and a Megatron judge deployed beside it)."""
    notes = []
    for key in ("deployment", "judge"):
        deployment = data.get(key) or {}
        if deployment.get("type") != "megatron" or deployment.get("backend") != "auto":
            continue
        section: Any = EXECUTION_TYPES.get(str((data.get("execution") or {}).get("type")))
        chosen = "builtin" if section is not None and not section.runs_containers else "export-deploy"
        deployment["backend"] = chosen
        notes.append(f"{key}.backend auto -> {chosen}")
    return notes


# The served name a packaged model's deployment config gives it; a user's checkpoint never borrows it.
PACKAGED_SERVED_NAMES = {"smollm2": "smollm2-135m-instruct", "tiny": "tiny"}


def packaged_checkpoint_dir(cache_dir: str, name: str) -> str:
    """Where `deployment.prepare=NAME` writes the packaged model: ckpteval's cache, never elsewhere."""
    return f"{cache_dir.rstrip('/')}/checkpoints/{name}"


def _settle_prepare(data: dict[str, Any]) -> list[str]:
    """`deployment.prepare` writes a packaged model only into ckpteval's cache (execution.cache_dir). A
    run.model anywhere else is the user's own checkpoint: it is served as it is (prepare off, so a path
    that does not exist is refused, never filled with the packaged model), under its own name rather than
    the packaged model's."""
    deployment = data.get("deployment") or {}
    name = deployment.get("prepare")
    if deployment.get("type") != "megatron" or not name:
        return []
    cache_dir = str((data.get("execution") or {}).get("cache_dir") or "")
    path = str(deployment.get("checkpoint_path") or "")
    if cache_dir and _same_path(path, packaged_checkpoint_dir(cache_dir, str(name))):
        return []
    deployment["prepare"] = None
    note = f"deployment.prepare {name} -> off: run.model={path} is your checkpoint, served as it is"
    packaged_name = PACKAGED_SERVED_NAMES.get(str(name))
    if packaged_name is not None and deployment.get("served_model_name") == packaged_name:
        own_name = Path(path.rstrip("/")).name or "megatron-model"
        deployment["served_model_name"] = own_name
        api = ((data.get("target") or {}).get("api_endpoint")) or {}
        if api.get("model_id") == packaged_name:
            api["model_id"] = own_name
        note += f", named {own_name!r}"
    return [note]


def _same_path(a: str, b: str) -> bool:
    return Path(a).expanduser().absolute() == Path(b).expanduser().absolute()


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


def served_endpoint_types(config: EvalConfig) -> tuple[str, ...]:
    """The endpoint types the deployment serves: a deployment ckpteval starts serves both routes;
    `deployment: none` serves `target.api_endpoint.type`, and the other type when its URL ends in its own
    OpenAI route (the other route is then beside it, `endpoint_url_for`)."""
    if not isinstance(config.deployment, NoDeployment):
        return tuple(BY_ENDPOINT_TYPE)
    api = config.target.api_endpoint
    if (api.url or "").rstrip("/").endswith(BY_ENDPOINT_TYPE[api.type]):
        return tuple(BY_ENDPOINT_TYPE)
    return (api.type,)


def endpoint_url_for(config: EvalConfig, endpoint_type: str) -> str:
    """With `deployment: none`, the URL a task of `endpoint_type` talks to: `target.api_endpoint.url` for
    tasks of the endpoint's own type; for the other type, the same server's other OpenAI route
    (`.../v1/completions` <-> `.../v1/chat/completions`)."""
    api = config.target.api_endpoint
    url = api.url or ""
    if endpoint_type == api.type:
        return url
    own, wanted = BY_ENDPOINT_TYPE[api.type], BY_ENDPOINT_TYPE[endpoint_type]
    base = url.rstrip("/")
    if not base.endswith(own):
        raise ConfigError(
            f"A task needs a {endpoint_type} endpoint, but target.api_endpoint.url ({url}) is a {api.type} URL "
            f"that does not end in {own}, so its {endpoint_type} route is unknown.",
            hint=f"Use an URL ending in {own}, or evaluate {endpoint_type} tasks in a separate invocation "
            f"with target.api_endpoint.type={endpoint_type}.",
        )
    return base[: -len(own)] + wanted


def check_config(
    config: EvalConfig, tasks: tuple[ResolvedTask, ...], *, cwd: Path, profile: Profile | None = None
) -> None:
    """Semantic checks the types cannot express; the first failure is a ConfigError naming the fix."""
    if not tasks:
        raise ConfigError(
            "No tasks to evaluate.", hint="Use a stage config that lists tasks (-c sft), or name tasks with -t."
        )
    _check_ranges(config, tasks)
    if profile is not None:
        check_cluster_paths(config, profile)
    _check_tasks(config, tasks)
    check_judged_tasks(config, tasks)
    _check_deployment(config, tasks, cwd=cwd)
    _check_judge_deployment(config, cwd=cwd)
    _check_export(config)


def _check_judge_deployment(config: EvalConfig, *, cwd: Path) -> None:
    """A judge deployed beside the model (`judge=builtin`, `judge=vllm`): a backend ckpteval can start as a
    second server, a port of its own, a checkpoint that exists (here), and GPUs that fit beside the model's."""
    from ckpteval.config.schema import VllmJudge, deployed_judge

    judge = deployed_judge(config)
    if judge is None:
        return
    if isinstance(judge, VllmJudge):
        _check_vllm_judge(judge, config, cwd=cwd)
        return
    if judge.backend != "builtin":
        raise ConfigError(
            f"judge.backend={judge.backend}: a judge deployed in the job is served by the builtin server for now.",
            hint="Use judge=builtin (judge.backend=builtin), or a judge that runs already: judge=api judge.url=... "
            "judge.model_id=...",
        )
    if not 1 <= judge.port <= MAX_PORT:
        raise ConfigError(f"judge.port must be between 1 and {MAX_PORT}, not {judge.port}.", hint="Set judge.port=N.")
    if judge.port == getattr(config.deployment, "port", None):
        raise ConfigError(
            f"judge.port and deployment.port are both {judge.port}: each deployment of the job has a port of its own.",
            hint=f"Set judge.port={judge.port + 1} (a taken port moves the server to a free one, said in its log).",
        )
    if not config.execution.on_cluster:
        path = Path(judge.checkpoint_path).expanduser()
        path = path if path.is_absolute() else cwd / path
        if not path.exists():
            raise ConfigError(
                f"The judge's checkpoint {judge.checkpoint_path} does not exist.",
                hint="Pass judge.checkpoint_path=/path/to/checkpoint (a Megatron checkpoint dir), or "
                "`evaluate prepare smollm2` to make one.",
            )
    node_gpus = config.execution.node_gpus()
    model_gpus = getattr(config.deployment, "num_gpus", 0) or 0
    if node_gpus is not None and judge.num_gpus > node_gpus * judge.num_nodes:
        raise ConfigError(
            f"judge.num_gpus={judge.num_gpus} is more than {judge.num_nodes} node(s) × {node_gpus} GPUs "
            f"(the judge runs on nodes of its own, beside the model's {model_gpus} GPUs).",
            hint="Lower judge.num_gpus, or raise judge.num_nodes.",
        )


def _check_vllm_judge(judge: Any, config: EvalConfig, *, cwd: Path) -> None:
    """A vLLM judge: a port of its own, a Hugging Face directory (or hub handle) to serve, and somewhere vLLM
    runs (its image on Slurm; here, a `vllm` on PATH)."""
    if not 1 <= judge.port <= MAX_PORT:
        raise ConfigError(f"judge.port must be between 1 and {MAX_PORT}, not {judge.port}.", hint="Set judge.port=N.")
    if judge.port == getattr(config.deployment, "port", None):
        raise ConfigError(
            f"judge.port and deployment.port are both {judge.port}: each deployment of the job has a port of its own.",
            hint=f"Set judge.port={judge.port + 1}.",
        )
    if not (judge.checkpoint_path or judge.hf_model_handle):
        raise ConfigError(
            "judge=vllm serves a Hugging Face model, and none is named.",
            hint="Pass judge.checkpoint_path=/path/to/hf-dir (or judge.hf_model_handle=org/name).",
        )
    execution = config.execution
    if not execution.runs_containers and not _runs_here(judge):
        raise ConfigError(
            "judge=vllm runs vLLM's container image; this machine runs no containers and has no `vllm`.",
            hint="Evaluate on a Slurm profile (--run/--batch PROFILE), or serve the judge yourself and use "
            "judge=api judge.url=... judge.model_id=...",
        )
    if not execution.on_cluster and judge.checkpoint_path and not judge.hf_model_handle:
        path = Path(judge.checkpoint_path).expanduser()
        path = path if path.is_absolute() else cwd / path
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"The judge's checkpoint {judge.checkpoint_path} is not a Hugging Face directory (no config.json).",
                hint="Pass judge.checkpoint_path=/path/to/hf-dir; a Megatron judge is judge=builtin.",
            )


MAX_PORT = 65535
MAX_REPEATS = 1000  # samples per problem; each is a full client run of the task


def _check_ranges(config: EvalConfig, tasks: tuple[ResolvedTask, ...]) -> None:
    """Numbers the types accept but nothing can use (a port past 65535, a zero batch, a million repeats)."""
    deployment, execution = config.deployment, config.execution
    bounds: list[tuple[str, Any, int, int | None]] = [
        ("execution.endpoint_readiness_timeout", execution.endpoint_readiness_timeout, 1, None),
    ]
    port = getattr(deployment, "port", None)  # every section that starts a server has one
    if port is not None:
        bounds.append(("deployment.port", port, 1, MAX_PORT))
    if isinstance(deployment, MegatronDeployment):
        bounds += [
            ("deployment.num_nodes", deployment.num_nodes, 1, None),
            ("deployment.num_replicas", deployment.num_replicas, 1, None),
            ("deployment.max_batch_size", deployment.max_batch_size, 1, None),
            ("deployment.prefix_cache_mib", deployment.prefix_cache_mib, 1, None),
        ]
    bounds += execution.resource_bounds()
    for key, value, low, high in bounds:
        if value is not None and (value < low or (high is not None and value > high)):
            allowed = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ConfigError(f"{key} must be {allowed}, not {value}.", hint=f"Set {key}=VALUE.")
    for task in tasks:
        if task.repeats > MAX_REPEATS:
            raise ConfigError(
                f"evaluation.tasks[{task.index}] ({task.name}): {task.repeats} samples per problem is more than "
                f"{MAX_REPEATS}; each sample is a full run of the task.",
                hint=f"Use -t {task.name}:K with K at most {MAX_REPEATS}.",
            )


def check_cluster_paths(config: EvalConfig, profile: Profile) -> None:
    """A Slurm run needs the profile's `remote_job_dir`, and its output_dir absolute on the cluster
    (nothing there expands ~ or $HOME). Checked here, before anything is contacted or written."""
    execution = config.execution
    if not execution.on_cluster:
        return
    remote_job_dir = profile.part.files_dir()
    if not remote_job_dir:
        raise ConfigError(
            f"Profile [{profile.name}] has no `remote_job_dir`, where jobs and results go on the cluster.",
            hint='Set remote_job_dir = "/lustre/.../ckpteval" (a directory you can write on the cluster) in env.toml.',
        )
    if not remote_job_dir.startswith("/"):
        raise ConfigError(
            f"Profile [{profile.name}]: remote_job_dir must be an absolute path on the cluster, "
            f"not {remote_job_dir!r}.",
            hint="Write it out in full (~ and $HOME are not expanded).",
        )
    output_dir = execution.output_dir
    if not output_dir.startswith("/"):
        raise ConfigError(
            f"execution.output_dir must be an absolute path on the cluster, not {output_dir!r}.",
            hint="Set remote_job_dir in the env.toml profile to an absolute path (~ and $HOME are not expanded).",
        )


def _check_export(config: EvalConfig) -> None:
    """What each destination's section checks of its settings (W&B: a project to put the run in)."""
    for section in config.export.values():
        check = getattr(section, "check", None)
        if check is not None:
            check()


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
                hint=f"Set target.api_endpoint.url=http://HOST:PORT{COMPLETIONS}.",
            )
        return  # a task whose endpoint type it does not serve: ckpteval.tasks.runnable.endpoint_served
    if not isinstance(deployment, MegatronDeployment):
        if getattr(deployment, "runs_in_image", False) and not execution.runs_containers and not _runs_here(deployment):
            raise ConfigError(
                f"deployment: {deployment.type} runs a container image; this machine runs no containers.",
                hint="Evaluate on a Slurm profile (--run/--batch PROFILE), or serve the model yourself and use "
                "deployment=none target.api_endpoint.url=...",
            )
        return
    _check_megatron_parallelism(deployment, execution)
    if not execution.on_cluster and deployment.prepare is None:
        path = Path(deployment.checkpoint_path).expanduser()
        path = path if path.is_absolute() else cwd / path
        if not path.exists():
            raise ConfigError(
                f"Checkpoint {deployment.checkpoint_path} does not exist.",
                hint="Pass run.model=/path/to/checkpoint (a Megatron checkpoint dir), or "
                "`evaluate prepare smollm2` to make one.",
            )
    if execution.runs_containers and deployment.backend == "export-deploy" and not deployment.image:
        raise ConfigError(
            "deployment.backend=export-deploy needs the NeMo container image.",
            hint="Set container_image in the env.toml profile, or deployment.image=...",
        )


def _runs_here(deployment: Any) -> bool:
    """A deployment whose server is a command installed on this machine too (`vllm`), or a package the interpreter
    running ckpteval imports (`sglang`: the job runs `<this python> -m sglang.launch_server`), runs here without
    its image."""
    import importlib.util
    import shutil

    executable = getattr(deployment, "executable_here", None)
    module = getattr(deployment, "module_here", None)
    return bool(executable and shutil.which(executable)) or bool(module and importlib.util.find_spec(module))


def _check_megatron_parallelism(deployment: MegatronDeployment, execution: Execution) -> None:
    """Parallel sizes and speed settings. Export-Deploy gives each replica num_gpus / num_replicas GPUs and
    starts Megatron on exactly that many ranks, so TP×PP×CP×EP×replicas must be the GPU count (0.2 exits
    with "Parallelism per replica must equal GPUs per replica" otherwise, 0.1 checks the same without EP;
    0.3+ no longer check and run the spare GPUs as idle data-parallel copies)."""
    tp = deployment.tensor_model_parallel_size
    pp = deployment.pipeline_model_parallel_size
    ep = deployment.expert_model_parallel_size
    cp = deployment.context_parallel_size
    sizes = {
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "expert_model_parallel_size": ep,
        "context_parallel_size": cp,
        "max_batch_size": deployment.max_batch_size,
        "num_nodes": deployment.num_nodes,
        "num_replicas": deployment.num_replicas,
        "micro_batch_size": deployment.micro_batch_size,
        "num_layers_in_first_pipeline_stage": deployment.num_layers_in_first_pipeline_stage,
        "num_layers_in_last_pipeline_stage": deployment.num_layers_in_last_pipeline_stage,
    }
    for key, value in sizes.items():
        if value is not None and value < 1:
            raise ConfigError(f"deployment.{key} must be at least 1, not {value}.")
    if deployment.num_gpus < 0:
        raise ConfigError(f"deployment.num_gpus must not be negative, not {deployment.num_gpus}.")
    if deployment.backend == "builtin":
        if tp * pp * cp > 1:
            raise ConfigError(
                f"The builtin server runs on one device; it cannot shard the model (TP={tp}, PP={pp}, CP={cp}).",
                hint="Use deployment.backend=export-deploy on a cluster for TP/PP/CP > 1.",
            )
        only_export = {
            "micro_batch_size": deployment.micro_batch_size is not None,
            "enable_cuda_graphs": deployment.enable_cuda_graphs,
            "enable_flash_decode": deployment.enable_flash_decode,
            "num_layers_in_first_pipeline_stage": deployment.num_layers_in_first_pipeline_stage is not None,
            "num_layers_in_last_pipeline_stage": deployment.num_layers_in_last_pipeline_stage is not None,
        }
        for key, is_set in only_export.items():
            if is_set:
                raise ConfigError(
                    f"deployment.{key} is an Export-Deploy setting; the builtin server does not use it.",
                    hint=f"Remove it (~deployment.{key}), or use deployment.backend=export-deploy on a cluster.",
                )
        return
    gpus = deployment.num_gpus
    if not execution.runs_containers:
        raise ConfigError(
            "deployment.backend=export-deploy runs in the NeMo container on GPUs, which this machine lacks.",
            hint="Use deployment.backend=builtin here, or --run/--batch a Slurm profile.",
        )
    if deployment.prepare is not None:
        raise ConfigError(
            f"deployment.prepare={deployment.prepare} writes a packaged model in the builtin server's job step; "
            "Export-Deploy serves a checkpoint that exists already.",
            hint=f"Prepare it first (`evaluate prepare {deployment.prepare} --output DIR` on the cluster's "
            "filesystem) and pass run.model=DIR deployment.prepare=null.",
        )
    per_replica = tp * pp * cp * ep
    replicas = deployment.num_replicas if deployment.num_replicas is not None else max(1, gpus // per_replica)
    if gpus == 0 or per_replica * replicas != gpus:
        raise ConfigError(
            f"TP×PP×CP×EP×replicas = {tp}×{pp}×{cp}×{ep}×{replicas} = {per_replica * replicas} GPUs, but "
            f"deployment.num_gpus={gpus}: Export-Deploy gives each replica num_gpus / num_replicas GPUs, "
            "and each replica must use all of its GPUs.",
            hint=f"Set deployment.num_replicas={max(1, gpus // per_replica)} (or leave it unset: as many as fit), "
            "or change the parallel sizes or num_gpus so that the product matches.",
        )
    if gpus % deployment.num_nodes != 0:
        raise ConfigError(
            f"deployment.num_gpus={gpus} does not split evenly over deployment.num_nodes={deployment.num_nodes}.",
            hint="Each node runs the same number of GPUs; use a multiple of num_nodes.",
        )
    stages = (deployment.num_layers_in_first_pipeline_stage, deployment.num_layers_in_last_pipeline_stage)
    if pp == 1 and any(n is not None for n in stages):
        raise ConfigError(
            "deployment.num_layers_in_first/last_pipeline_stage split the layers unevenly over pipeline stages, "
            "but pipeline_model_parallel_size is 1.",
            hint="Set pipeline_model_parallel_size > 1, or remove the layer counts.",
        )
    if deployment.micro_batch_size is not None and deployment.micro_batch_size > deployment.max_batch_size:
        raise ConfigError(
            f"deployment.micro_batch_size={deployment.micro_batch_size} is larger than "
            f"max_batch_size={deployment.max_batch_size}.",
            hint="A micro batch is a slice of a batch: keep micro_batch_size <= max_batch_size.",
        )
    node_gpus = execution.node_gpus()
    if node_gpus is not None:
        available = node_gpus * deployment.num_nodes
        if gpus > available:
            raise ConfigError(
                f"deployment.num_gpus={gpus} is more than {deployment.num_nodes} node(s) × {node_gpus} GPUs.",
                hint="Raise deployment.num_nodes (and the profile's nodes) or lower num_gpus.",
            )
