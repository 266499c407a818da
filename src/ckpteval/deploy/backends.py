"""Deployment backends, in one registry: how a job starts each kind of deployment, and what it can do.

An entry is keyed by its kind (`deployment.type`, and megatron's `backend`: "megatron/builtin") and carries its
config section (the dataclass `deployment` is typed as), `launch` (the command that starts it inside the job,
with its image and nodes), and what the job may rely on: whether it reports the job's identity token (and on
which route), whether it holds its own port and writes it down, whether it publishes the tokenizer it serves
with, and why it is known to mix request settings in a batch. `job.build` asks the registry, never the type.

Registering a backend registers its section with the config (`config.schema.register_deployment_section`):
from then on `deployment.type=<its type>` is typed by it, and `deployment=<its type>` selects it with its
defaults where no `conf/deployment/<type>.yaml` does. The backends ckpteval ships are registered at the end
of this module; their sections are in `config.schema` (a config is typed before any backend is asked) and
their command lines beside them (`deploy.commands`, `deploy.export_deploy`).
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ckpteval.config.schema import (
    DEPLOYMENT_TYPES,
    GenericDeployment,
    MegatronDeployment,
    SglangDeployment,
    VllmDeployment,
    deployment_types,
    register_deployment_section,
)
from ckpteval.errors import ConfigError
from ckpteval.registry import Registry


@dataclass(frozen=True)
class LaunchContext:
    """What the job tells a backend about the deployment it starts."""

    python: str  # the interpreter that imports ckpteval (for the builtin server)
    port: int
    identity: str | None  # the token to report, where the backend `reports_identity`
    port_file: str | None  # where to write the port held, where the backend `holds_port`
    publish_tokenizer: str | None  # where to write the tokenizer served with, where it `publishes_tokenizer`
    containers: bool  # the job runs steps in their images (Slurm); else the profile's own processes
    # the checkpoint iteration the job pinned when it described the checkpoint ("1000", "release"), for a
    # backend that `takes_iteration`; None: not described before the job (prepared by it), or an endpoint
    iteration: str | None = None
    report_file: str | None = None  # where to write what it loaded, where the backend `reports_checkpoint`
    # the address it listens on: 127.0.0.1 beside the job's first node; all of a node's addresses when it runs
    # on nodes of its own (a judge on Slurm), reached at that node's name
    host: str = "127.0.0.1"
    # the Hugging Face directory to serve instead of `checkpoint_path`: the export step's link, where the
    # backend `serves_hf_export` and the checkpoint is a Megatron one (`ckpteval.job.hf_export`)
    served_dir: str | None = None


@dataclass(frozen=True)
class Launch:
    """How a deployment starts inside the job: one bash command line, in `image` (if any), on `nodes`;
    `mounted`: the step gets the job's container mounts."""

    command: str
    image: str | None = None
    nodes: int = 1
    mounted: bool = True


# the route of each `identity_route` ("health": the deployment's own health route); the job fetches it and finds
# the identity in the body (the builtin: /v1/health `deployment`; vLLM: a second served model name in /v1/models;
# SGLang: its weight version on /get_model_info)
IDENTITY_ROUTES = {"models": "/v1/models", "model_info": "/get_model_info"}


@dataclass(frozen=True)
class DeploymentBackend:
    """One kind of deployment (see the module docstring)."""

    kind: str
    section: type
    launch: Callable[[Any, LaunchContext], Launch]
    # where it reports the job's identity (`IDENTITY_ROUTES`); None: it cannot
    identity_route: Literal["health", "models", "model_info"] | None = None
    holds_port: bool = False
    publishes_tokenizer: bool = False
    # it serves the iteration it is given (`LaunchContext.iteration`); else it reads the tracker itself when
    # it loads, and the job checks before starting it that the tracker still names the pinned iteration
    takes_iteration: bool = False
    # it reports what it loaded (path, iteration, content identity: `ckpteval.server.loaded`) in a file and on
    # every response; else results record the checkpoint as described before submission, unverified
    reports_checkpoint: bool = False
    known_mixing: Callable[[Any], str] | None = None  # why it mixes request settings, known before any probe
    # its step before the job starts, where the job runs: "module:function" taking (plan, compiled, remote) and
    # returning (the plan, a line saying what it found, or None); imported only when a job is submitted
    # (Export-Deploy's: the entry point its image really has, `cluster.export_deploy.resolve_for_run`)
    before_start: str | None = None
    # it serves Hugging Face directories: a Megatron checkpoint_path is exported by the job's first step
    serves_hf_export: bool = False
    # a running one loads another checkpoint of the same model in place (`deployment.load_into`,
    # `ckpteval.server.inplace`): what `evaluate watch` keeps across checkpoints; else a fresh one each time
    loads_in_place: bool = False

    @property
    def reports_identity(self) -> bool:
        return self.identity_route is not None


def _register_section(backend: DeploymentBackend) -> None:
    register_deployment_section(backend.section)


def _forget_section(backend: DeploymentBackend) -> None:
    """Its section goes with the last backend that carries it."""
    if any(b.section is backend.section for b in BACKENDS.entries()):
        return
    for name in deployment_types(backend.section):
        if DEPLOYMENT_TYPES.get(name) is backend.section:
            del DEPLOYMENT_TYPES[name]


BACKENDS: Registry[DeploymentBackend] = Registry(
    "deployment backend",
    entry_type=DeploymentBackend,
    key=lambda b: b.kind,
    group="deployments",
    on_register=_register_section,
    on_unregister=_forget_section,
)


def register_backend(backend: DeploymentBackend) -> DeploymentBackend:
    """Add (or replace) the backend of `backend.kind`, and its section as the config's `deployment.type`."""
    return BACKENDS.register(backend)


def unregister_backend(kind: str) -> None:
    """Remove the backend of `kind` (a test's double, when the test ends), and its section with the last
    backend that carries it."""
    BACKENDS.unregister(kind)


def deployment_kind(deployment: Any) -> str:
    """The registry key of a typed deployment section: its type, and megatron's backend after a slash."""
    backend = getattr(deployment, "backend", None)
    return f"{deployment.type}/{backend}" if backend else str(deployment.type)


def backend_for(deployment: Any) -> DeploymentBackend:
    """The registered backend that starts `deployment`; ConfigError for a kind none is registered for."""
    kind = deployment_kind(deployment)
    found = BACKENDS.get(kind)
    if found is None:
        known = ", ".join(sorted(BACKENDS.names()))
        raise ConfigError(f"No deployment backend is registered for {kind!r}.", hint=f"Known: {known}.")
    return found


def registered_backends() -> dict[str, DeploymentBackend]:
    """Kind -> backend, for documentation and tests."""
    return {b.kind: b for b in BACKENDS.entries()}


def _builtin(deployment: MegatronDeployment, context: LaunchContext) -> Launch:
    from ckpteval.deploy.commands import builtin_command

    command = builtin_command(
        deployment,
        python=context.python,
        port=context.port,
        publish_tokenizer=context.publish_tokenizer,
        identity=context.identity,
        port_file=context.port_file,
        iteration=context.iteration,
        report_file=context.report_file,
        host=context.host,
    )
    # builtin runs ckpteval itself: no container needed beyond the profile's image, if any
    image = deployment.image if context.containers else None
    return Launch(command=command, image=image, mounted=bool(image))


def _export_deploy(deployment: MegatronDeployment, context: LaunchContext) -> Launch:
    """Export-Deploy's Ray Serve deployment in the NeMo container; unprobed, the entry point is the 0.4+ layout
    (a cluster run swaps in what the image really has)."""
    from ckpteval.deploy.export_deploy import DEFAULT_ENTRY_POINT, export_deploy_command

    if deployment.load_into:
        raise ConfigError(
            "deployment.load_into loads a checkpoint into a running builtin server; Export-Deploy cannot load "
            "in place.",
            hint="Drop deployment.load_into (a fresh deployment), or set deployment.backend=builtin.",
        )

    command = export_deploy_command(deployment, DEFAULT_ENTRY_POINT, port=context.port)
    return Launch(command=command, image=deployment.image, nodes=deployment.num_nodes)


def _export_deploy_mixing(deployment: MegatronDeployment) -> str:
    from ckpteval.deploy.export_deploy import DEFAULT_ENTRY_POINT, mixes_settings

    return mixes_settings(DEFAULT_ENTRY_POINT)


def _vllm(deployment: VllmDeployment, context: LaunchContext) -> Launch:
    from ckpteval.deploy.commands import vllm_command

    command = vllm_command(deployment, port=context.port, identity=context.identity, model=context.served_dir)
    # in its image where steps run in images; here (`executable_here`), the `vllm` installed on this machine
    return Launch(command=command, image=deployment.image if context.containers else None)


def _sglang(deployment: SglangDeployment, context: LaunchContext) -> Launch:
    from ckpteval.deploy.commands import sglang_command, sglang_load_command

    if deployment.load_into:  # the kept server loads the export: ckpteval's Python asks it, as the builtin's does
        assert context.identity is not None, "SGLang reports the job's identity"
        command = sglang_load_command(
            deployment,
            python=context.python,
            model=context.served_dir,
            identity=context.identity,
            port_file=context.port_file,
        )
        return Launch(command=command, image=None, mounted=False)  # the profile's Python, not SGLang's image

    # in its image where steps run in images; here (`module_here`), the interpreter that runs ckpteval
    python = "python3" if context.containers else context.python
    command = sglang_command(
        deployment, port=context.port, model=context.served_dir, identity=context.identity, python=python
    )
    return Launch(command=command, image=deployment.image if context.containers else None)


def _generic(deployment: GenericDeployment, context: LaunchContext) -> Launch:
    from ckpteval.deploy.commands import generic_command

    return Launch(command=generic_command(deployment), image=deployment.image)


register_backend(
    DeploymentBackend(
        "megatron/builtin",
        MegatronDeployment,
        _builtin,
        identity_route="health",
        holds_port=True,
        publishes_tokenizer=True,
        takes_iteration=True,
        reports_checkpoint=True,
        loads_in_place=True,
    )
)
register_backend(
    DeploymentBackend(
        "megatron/export-deploy",
        MegatronDeployment,
        _export_deploy,
        known_mixing=_export_deploy_mixing,
        before_start="ckpteval.cluster.export_deploy:resolve_for_run",
    )
)
register_backend(
    DeploymentBackend(
        "vllm",
        VllmDeployment,
        _vllm,
        identity_route="models",
        serves_hf_export=True,
        before_start="ckpteval.job.hf_export:make_cache_dir",
    )
)
# SGLang takes one served model name: the job's identity is its weight version, reported on /get_model_info
register_backend(
    DeploymentBackend(
        "sglang",
        SglangDeployment,
        _sglang,
        identity_route="model_info",
        serves_hf_export=True,
        before_start="ckpteval.job.hf_export:make_cache_dir",
        loads_in_place=True,  # `/update_weights_from_disk` with the next export (`deploy.sglang_inplace`)
    )
)
register_backend(DeploymentBackend("generic", GenericDeployment, _generic))
