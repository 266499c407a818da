"""The typed shape of a compiled evaluation config.

Sections mirror nemo-evaluator-launcher's (`execution`, `deployment`, `target`, `evaluation`, `export`)
plus `run` (profile, W&B defaults, model). A resolved config dict becomes an `EvalConfig` through
`ckpteval.config.typed.from_mapping`, which rejects unknown keys and wrong types with the dotted path.

`deployment` and `export` are typed by what is registered, not by a fixed list: `deployment` by the section
its `type` names in `DEPLOYMENT_TYPES`, `export.<name>` by the section of destination `<name>` in
`EXPORT_SECTIONS`. The shipped sections are registered here; the deployment and destination registries
(`deploy.backends.register_backend`, `export.destinations.register_destination`) register the section each
entry carries, so a backend or destination registered from elsewhere is named in a config like a shipped one.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from ckpteval.config.typed import Registered
from ckpteval.errors import ConfigError

EndpointType = Literal["completions", "chat"]


@dataclass(frozen=True, kw_only=True)
class WandbRun:
    entity: str | None = None
    project: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunSection:
    env: dict[str, Any] = field(default_factory=dict)  # the profile (see Profile); typed there
    wandb: WandbRun = field(default_factory=WandbRun)
    model: str | None = None
    name: str | None = None


# What validation and planning ask of an execution section is what its jobs can do (run container images,
# live on another machine, offer GPUs), never which executor it is: a new executor's section answers the same.
# `execution.type` -> its section: filled by registration (an executor's entry carries its section,
# `config.executors.register_executor`; the shipped ones are registered where they are declared, below).
EXECUTION_TYPES: dict[str, type] = {}
_S = TypeVar("_S", bound=type)


def register_execution_section(section: _S) -> _S:
    """Make `execution.type=<its type>` select `section` (a dataclass with a `type: Literal[...]` field)."""
    hint = typing.get_type_hints(section).get("type")
    if typing.get_origin(hint) is not Literal:
        raise TypeError(f"{section.__name__}: an execution section is a dataclass with a `type: Literal[...]` field")
    for name in typing.get_args(hint):
        EXECUTION_TYPES[str(name)] = section
    return section


@register_execution_section
@dataclass(frozen=True, kw_only=True)
class LocalExecution:
    type: Literal["local"]
    output_dir: str
    cache_dir: str
    endpoint_readiness_timeout: int = 600
    env_vars: dict[str, str] = field(default_factory=dict)

    on_cluster: ClassVar[bool] = False  # output_dir and the checkpoint are paths on this machine
    runs_containers: ClassVar[bool] = False  # steps run as plain processes: no container image

    def resource_bounds(self) -> list[tuple[str, int, int, int | None]]:
        """(key, value, at least, at most) of the section's resource requests: none here."""
        return []

    def node_gpus(self) -> int | None:
        """GPUs per node (None: not known; nothing is checked against it)."""
        return None

    def container_mounts(self) -> dict[str, str]:
        """Mounts into every container step (none: no containers)."""
        return {}


@register_execution_section
@dataclass(frozen=True, kw_only=True)
class SlurmExecution:
    type: Literal["slurm"]
    hostname: str | None
    username: str | None
    account: str | None
    partition: str | None
    num_nodes: int
    gpus_per_node: int
    walltime: str
    output_dir: str
    cache_dir: str
    endpoint_readiness_timeout: int = 1800
    mounts: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    sbatch_extra_flags: dict[str, Any] = field(default_factory=dict)

    on_cluster: ClassVar[bool] = True  # output_dir and the checkpoint are paths on the cluster
    runs_containers: ClassVar[bool] = True  # each step runs in its container image (enroot/pyxis)

    def resource_bounds(self) -> list[tuple[str, int, int, int | None]]:
        """(key, value, at least, at most) of the section's resource requests."""
        return [
            ("execution.num_nodes", self.num_nodes, 1, None),
            ("execution.gpus_per_node", self.gpus_per_node, 0, None),
        ]

    def node_gpus(self) -> int | None:
        """GPUs per node."""
        return self.gpus_per_node

    def container_mounts(self) -> dict[str, str]:
        """Mounts into every container step: `execution.mounts` (host path -> container path)."""
        return dict(self.mounts)


@register_execution_section
@dataclass(frozen=True, kw_only=True)
class SshExecution:
    """A machine with GPUs reached over SSH and no scheduler (a workstation): the job runs there detached, in
    the profile's Python environment, on GPUs it locks for itself (`ckpteval.execution.ssh`)."""

    type: Literal["ssh"]
    hostname: str | None
    username: str | None
    gpus: int  # GPUs one invocation takes there (each locked for it while it runs; 0: none, CPU only)
    machine_gpus: int  # GPUs the machine has (the profile's gpus_per_node)
    output_dir: str
    cache_dir: str
    endpoint_readiness_timeout: int = 1800
    env_vars: dict[str, str] = field(default_factory=dict)

    on_cluster: ClassVar[bool] = True  # output_dir and the checkpoint are paths on that machine
    runs_containers: ClassVar[bool] = False  # steps run as processes of the profile's Python there

    def resource_bounds(self) -> list[tuple[str, int, int, int | None]]:
        """(key, value, at least, at most) of the section's resource requests."""
        return [
            ("execution.machine_gpus", self.machine_gpus, 0, None),
            ("execution.gpus", self.gpus, 0, self.machine_gpus),
        ]

    def node_gpus(self) -> int | None:
        """The GPUs the job gets."""
        return self.gpus

    def container_mounts(self) -> dict[str, str]:
        """Mounts into every container step (none: no containers)."""
        return {}


Execution = LocalExecution | SlurmExecution | SshExecution


@dataclass(frozen=True, kw_only=True)
class Endpoints:
    completions: str
    chat: str
    health: str


# the dtype of the Hugging Face export vLLM/SGLang serve of a Megatron checkpoint (`hfexport.write.DTYPES`)
ExportDtype = Literal["checkpoint", "float32", "bfloat16", "float16"]

FROM_CHECKPOINT = "from-checkpoint"  # deployment.tokenizer: the checkpoint's own tokenizer, as the job publishes it

S = TypeVar("S", bound=type)

# `deployment.type` -> its section; `export.<name>` -> destination <name>'s section. Filled by registration.
DEPLOYMENT_TYPES: dict[str, type] = {}
EXPORT_SECTIONS: dict[str, type] = {}


def deployment_types(section: type) -> tuple[str, ...]:
    """The `deployment.type` values `section` is for: its `type: Literal[...]` field's."""
    hint = typing.get_type_hints(section).get("type") if dataclasses.is_dataclass(section) else None
    if typing.get_origin(hint) is not Literal:
        raise TypeError(f"{section.__name__}: a deployment section is a dataclass with a `type: Literal[...]` field")
    return tuple(str(t) for t in typing.get_args(hint))


def register_deployment_section(section: S) -> S:
    """Make `deployment.type=<its type>` select `section` (a later registration of the same type replaces it)."""
    for name in deployment_types(section):
        DEPLOYMENT_TYPES[name] = section
    return section


def register_export_section(name: str) -> typing.Callable[[S], S]:
    """Make `export.<name>` typed by the decorated section, which must have a default for every key (a
    config that does not name the destination gets them) and an `enabled` switch. A `check()` method, if it
    has one, is called when a config is compiled (it raises ConfigError for settings it cannot export with)."""

    def register(section: S) -> S:
        defaults = section()
        if not isinstance(getattr(defaults, "enabled", None), bool):
            raise TypeError(f"{section.__name__}: an export section has an `enabled: bool` key")
        EXPORT_SECTIONS[name] = section
        return section

    return register


@register_deployment_section
@dataclass(frozen=True, kw_only=True)
class MegatronDeployment:
    type: Literal["megatron"]
    backend: Literal["auto", "builtin", "export-deploy"]
    checkpoint_path: str
    prepare: Literal["smollm2", "tiny"] | None = None
    tokenizer: str | None
    # the Hugging Face model the checkpoint came from (a directory or cached hub id), compared with its args
    origin: str | None = None
    ignore_origin_mismatch: bool = False  # serve a checkpoint whose args disagree with its origin, as it is
    ignore_unexpected_tensors: bool = False  # serve a checkpoint holding tensors its args' model lacks, without them
    served_model_name: str
    image: str | None = None
    port: int = 8000
    num_gpus: int = 8
    num_nodes: int = 1
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    context_parallel_size: int = 1  # export-deploy only
    num_replicas: int | None = None  # export-deploy: None = as many as fit, num_gpus / (TP×PP×CP×EP)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_batch_size: int = 16
    prefix_cache: bool = True  # builtin only: compute each shared token prefix once
    prefix_cache_mib: int | None = None  # builtin only: the prefix cache's memory; None: sized to the machine
    access_log: bool = False  # builtin only: log every request in the deployment's log
    # builtin only: load the checkpoint in place into the running server of this load directory instead of
    # starting one (`ckpteval.server.inplace_client`; what `evaluate watch` sets)
    load_into: str | None = None
    # export-deploy speed settings (see docs/deploy.md); None/False: Export-Deploy's default
    micro_batch_size: int | None = None
    enable_cuda_graphs: bool = False
    enable_flash_decode: bool = False
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    model_type: str = "gpt"
    ray_start_args: str = ""  # export-deploy on several nodes: appended to every node's `ray start`
    env_vars: dict[str, str] = field(default_factory=dict)
    extra_args: str = ""
    endpoints: Endpoints


@register_deployment_section
@dataclass(frozen=True, kw_only=True)
class VllmDeployment:
    type: Literal["vllm"]
    checkpoint_path: str | None
    hf_model_handle: str | None = None
    tokenizer: str | None
    served_model_name: str
    image: str
    port: int = 8000
    tensor_parallel_size: int = 8
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.95
    # a Megatron checkpoint_path is exported to Hugging Face by the job's first step (ckpteval.job.hf_export)
    # in this dtype: "checkpoint" (the stored weights') or float32 / bfloat16 / float16
    export_dtype: ExportDtype = "checkpoint"
    env_vars: dict[str, str] = field(default_factory=dict)
    extra_args: str = ""
    endpoints: Endpoints

    runs_in_image: ClassVar[bool] = True  # its server is in `image`: the execution must run containers
    executable_here: ClassVar[str] = "vllm"  # on PATH here, it runs on this machine without its image


@register_deployment_section
@dataclass(frozen=True, kw_only=True)
class SglangDeployment:
    """SGLang's OpenAI-compatible server (`python3 -m sglang.launch_server`) on a Hugging Face directory, or on
    a Megatron checkpoint through the job's export step, as vLLM."""

    type: Literal["sglang"]
    checkpoint_path: str | None
    hf_model_handle: str | None = None
    tokenizer: str | None
    served_model_name: str
    image: str
    port: int = 8000
    tensor_parallel_size: int = 8
    data_parallel_size: int = 1
    mem_fraction_static: float | None = None  # None: SGLang's own choice
    export_dtype: ExportDtype = "checkpoint"
    # load the export into the running SGLang server of this load directory (`/update_weights_from_disk`)
    # instead of starting one (`ckpteval.deploy.sglang_inplace`; what `evaluate watch` sets)
    load_into: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    extra_args: str = ""
    endpoints: Endpoints

    runs_in_image: ClassVar[bool] = True  # its server is in `image`: the execution must run containers
    module_here: ClassVar[str] = "sglang"  # importable here, it runs on this machine without its image


@register_deployment_section
@dataclass(frozen=True, kw_only=True)
class GenericDeployment:
    type: Literal["generic"]
    image: str
    command: str
    checkpoint_path: str | None = None
    tokenizer: str | None = None
    served_model_name: str
    port: int = 8000
    env_vars: dict[str, str] = field(default_factory=dict)
    endpoints: Endpoints

    runs_in_image: ClassVar[bool] = True  # its server is in `image`: the execution must run containers


@register_deployment_section
@dataclass(frozen=True, kw_only=True)
class NoDeployment:
    type: Literal["none"]
    tokenizer: str | None = None
    served_model_name: str = "model"


# `judge.type` -> its section (the judge model of judge-scored tasks: `ckpteval.tasks.judging`).
JUDGE_TYPES: dict[str, type] = {}
DEFAULT_JUDGE_MAX_ERROR_RATE = 0.05  # judge replies that failed or could not be read, past which a task fails


def register_judge_section(section: S) -> S:
    """Make `judge.type=<its type>` (and `judge=<type>`) select `section`."""
    for name in deployment_types(section):
        JUDGE_TYPES[name] = section
    return section


@register_judge_section
@dataclass(frozen=True, kw_only=True)
class NoJudge:
    """No judge: a task scored by a judge model is refused (`ckpteval.tasks.judge_check`)."""

    type: Literal["none"]


@register_judge_section
@dataclass(frozen=True, kw_only=True)
class ApiJudge:
    """A judge reached as an OpenAI-compatible API: `url` is its base (`.../v1`), `model_id` the model it
    serves, `api_key_name` the NAME of the variable holding its key here (the key reaches the job in an
    owner-only file, like the W&B key; never in the config, a script or a log)."""

    type: Literal["api"]
    url: str
    model_id: str
    api_key_name: str | None = None
    max_error_rate: float = DEFAULT_JUDGE_MAX_ERROR_RATE


@register_judge_section
@dataclass(frozen=True, kw_only=True)
class SelfJudge:
    """The evaluated model judges its own answers (asked for in so many words: `judge=self`)."""

    type: Literal["self"]
    max_error_rate: float = DEFAULT_JUDGE_MAX_ERROR_RATE


@register_judge_section
@dataclass(frozen=True, kw_only=True)
class MegatronJudge(MegatronDeployment):
    """A Megatron judge deployed in the same job as the model, as a second server (`judge=builtin
    judge.checkpoint_path=...`): the keys of `deployment=megatron`, its own port, identity and log (the role
    `judge` of `ckpteval.job.roles`). Its served model name is the judge model id the tasks are told."""

    max_error_rate: float = DEFAULT_JUDGE_MAX_ERROR_RATE


@register_judge_section
@dataclass(frozen=True, kw_only=True)
class VllmJudge(VllmDeployment):
    """A Hugging Face judge served by vLLM in the same job as the model (`judge=vllm
    judge.checkpoint_path=<HF dir>`): the keys of `deployment=vllm`, its own port, identity (a second served
    model name, listed by its /v1/models) and log. Its served model name is the judge model id the tasks are
    told."""

    max_error_rate: float = DEFAULT_JUDGE_MAX_ERROR_RATE


Judge = NoJudge | ApiJudge | SelfJudge | MegatronJudge | VllmJudge


def deployed_judge(config: EvalConfig) -> MegatronJudge | VllmJudge | None:
    """The judge the job deploys beside the model (None: an API, the model itself, or none)."""
    judge = config.judge
    return judge if isinstance(judge, MegatronJudge | VllmJudge) else None


# For type checkers: the shipped sections. The config accepts whatever DEPLOYMENT_TYPES holds when it is typed.
Deployment = MegatronDeployment | VllmDeployment | SglangDeployment | GenericDeployment | NoDeployment


@dataclass(frozen=True, kw_only=True)
class ApiEndpoint:
    url: str | None = None
    model_id: str
    type: EndpointType = "completions"
    api_key_name: str | None = None


@dataclass(frozen=True, kw_only=True)
class Target:
    api_endpoint: ApiEndpoint


@dataclass(frozen=True, kw_only=True)
class Params:
    """nemo-evaluator's `config.params`; harness-specific settings go under `extra`."""

    limit_samples: int | float | None = None
    parallelism: int | None = None
    max_retries: int | None = None
    request_timeout: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    task: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class EvaluatorConfigSection:
    params: Params = field(default_factory=Params)
    type: str | None = None


@dataclass(frozen=True, kw_only=True)
class EvaluatorTargetEndpoint:
    adapter_config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class EvaluatorTarget:
    api_endpoint: EvaluatorTargetEndpoint = field(default_factory=EvaluatorTargetEndpoint)


@dataclass(frozen=True, kw_only=True)
class NemoEvaluatorConfig:
    """The launcher-shaped `nemo_evaluator_config` (global, and per task where it wins)."""

    config: EvaluatorConfigSection = field(default_factory=EvaluatorConfigSection)
    target: EvaluatorTarget = field(default_factory=EvaluatorTarget)


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    name: str
    container: str | None = None
    endpoint_type: EndpointType | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    nemo_evaluator_config: NemoEvaluatorConfig = field(default_factory=NemoEvaluatorConfig)
    dataset_dir: str | None = None
    repeats: int = 0  # 0: one greedy sample; k > 0: k samples with distinct seeds
    request_params: dict[str, Any] = field(default_factory=dict)  # added to every request body (top_k, ...)


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    nemo_evaluator_config: NemoEvaluatorConfig = field(default_factory=NemoEvaluatorConfig)
    env_vars: dict[str, str] = field(default_factory=dict)
    offline_data: Literal["auto", "on", "off"] = "auto"
    # tasks run side by side against the one deployment; None: all of them, at most MAX_PARALLEL_TASKS
    max_parallel_tasks: int | None = None
    # task clients start with the deployment and prepare while the model loads (their first request waits
    # for its health); false: they start once it is healthy
    prepare_during_load: bool = True
    tasks: list[TaskConfig] = field(default_factory=list)


@register_export_section("wandb")
@dataclass(frozen=True, kw_only=True)
class WandbExport:
    enabled: bool = False
    entity: str | None = None
    project: str | None = None
    log_mode: Literal["multi_task", "per_task"] = "multi_task"
    name: str | None = None  # run name; default run.name, else eval-<invocation>
    group: str | None = None  # default: the invocation id
    description: str | None = None  # the run's notes
    tags: list[str] = field(default_factory=list)
    job_type: str = "evaluation"
    timeout: int = 60  # seconds W&B may take to accept a run before the export gives up

    def check(self) -> None:
        """W&B needs a project to put the run in; without one it would land in "uncategorized"."""
        if self.enabled and not self.project and not os.environ.get("WANDB_PROJECT"):
            raise ConfigError(
                "export.wandb is enabled but no W&B project is set.",
                hint='Set project in env.toml [wandb] (project = "evals"), or export.wandb.project=NAME, '
                "or $WANDB_PROJECT; or turn the export off with export.wandb.enabled=false.",
            )


@register_export_section("mlflow")
@dataclass(frozen=True, kw_only=True)
class MlflowExport:
    enabled: bool = False
    tracking_uri: str | None = None
    experiment_name: str = "ckpteval"
    tags: dict[str, str] = field(default_factory=dict)


class ExportSection(Mapping[str, Any]):
    """`export`: each registered destination's section, by name (`export.wandb.enabled` reads as
    `section.wandb.enabled`, `section["wandb"].enabled`); a destination the config does not name has its
    section's defaults. `ExportSection(wandb=WandbExport(enabled=True))` builds one in code."""

    def __init__(
        self, sections: Mapping[str, Any] | None = None, /, *, unregistered: tuple[str, ...] = (), **named: Any
    ) -> None:
        given = {**(sections or {}), **named}
        self._sections = {name: given.get(name) or cls() for name, cls in EXPORT_SECTIONS.items()} | given
        # enabled in a saved config, but not registered where it is read (see export.invocation.export_section)
        self.unregistered = unregistered

    def __getitem__(self, name: str) -> Any:
        return self._sections[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sections)

    def __len__(self) -> int:
        return len(self._sections)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_sections"][name]
        except KeyError:
            raise AttributeError(f"export has no destination {name!r}") from None

    def __repr__(self) -> str:
        return f"ExportSection({self._sections!r})"


Export = Annotated[ExportSection, Registered(EXPORT_SECTIONS)]  # how `export` is typed (`typed_value`)
SHIPPED_EXPORT_SECTIONS = frozenset(EXPORT_SECTIONS)  # those registered above: conf/default.yaml declares them


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """A compiled, validated evaluation config."""

    run: RunSection
    execution: Annotated[Execution, Registered(EXECUTION_TYPES, by="type")]
    deployment: Annotated[Deployment, Registered(DEPLOYMENT_TYPES, by="type")]
    target: Target
    evaluation: Evaluation
    export: Export = field(default_factory=ExportSection)
    judge: Annotated[Judge, Registered(JUDGE_TYPES, by="type")] = field(default_factory=lambda: NoJudge(type="none"))
