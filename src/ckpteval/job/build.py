"""Make a `JobPlan` from a compiled config: which command serves the model, which client runs each task.

The deployment's command, and what the job may rely on it for (its identity, its own port, a published
tokenizer), come from its registered backend (`ckpteval.deploy.backends`); none: nothing (an endpoint runs).
Task clients are what the launcher runs in each eval-factory container: `nemo-evaluator run_eval`.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.config.compile import CompiledConfig, ResolvedTask, endpoint_url_for
from ckpteval.config.executors import Launcher
from ckpteval.config.schema import FROM_CHECKPOINT, MegatronDeployment, NoDeployment
from ckpteval.deploy.backends import IDENTITY_ROUTES, DeploymentBackend, LaunchContext, backend_for
from ckpteval.invocation.jobdir import JobDir
from ckpteval.job.plan import DeploymentPlan, JobPlan, RequestGroups, Step, TaskPlan, TaskRun, parallel_tasks
from ckpteval.job.roles import JUDGE, Role, deployed_roles

HOOK_SUBDIR = JobDir.HOOK


@dataclass(frozen=True)
class Toolchain:
    """Where the job finds ckpteval's Python and the harness client (differs between here and a cluster)."""

    python: str  # runs `-m ckpteval.server` (builtin deployment)
    evaluator: str  # the nemo-evaluator executable (inside the eval-factory image: "nemo-evaluator")
    hook_dir: str | None = None  # offline-data hook for the harness (None: not available there)
    # runs the hook directory's standard-library scripts in the job script itself (the request-settings probe)
    script_python: str = "python3"


def local_toolchain() -> Toolchain:
    """This machine: the interpreter running ckpteval and the nemo-evaluator beside it."""
    import sys

    from ckpteval.tasks.client import hook_dir

    bin_dir = Path(sys.executable).parent
    return Toolchain(
        python=sys.executable,
        evaluator=str(bin_dir / "nemo-evaluator"),
        hook_dir=str(hook_dir()),
        script_python=sys.executable,
    )


def _reports_identity(deployment: object) -> bool:
    """Deployments that can report the job's identity token (the builtin server: `--identity`; vLLM: the token
    as a second served model name, listed by /v1/models; SGLang: its weight version, on /get_model_info).
    Export-Deploy and a generic command cannot: their endpoints are recorded as unverified."""
    return backend_for(deployment).reports_identity


def _pinned_tracker(checkpoint: str | None, pinned: str | None, *, takes_iteration: bool) -> str | None:
    """The tracker file the job checks still names the pinned iteration before it starts a deployment that
    reads the tracker itself (Export-Deploy takes a root, not an iteration); None when the deployment is
    given the iteration (`takes_iteration`, its backend says), or nothing is pinned."""
    from ckpteval.checkpoint.layout import TRACKER_FILE

    if pinned is None or not checkpoint or takes_iteration:
        return None
    return f"{checkpoint.rstrip('/')}/{TRACKER_FILE}"


def build_plan(
    compiled: CompiledConfig,
    *,
    invocation: str,
    job_dir: str,
    toolchain: Toolchain,
    launcher: Launcher,
    pinned: str | None = None,
    checkpoint_layout: str | None = None,
) -> JobPlan:
    """The job for `compiled`, to run in `job_dir` (absolute; on the cluster for Slurm). `pinned`: the
    checkpoint iteration to serve ("1000", "release"), as described before submission; `checkpoint_layout`:
    the described checkpoint's (whether vLLM/SGLang serve it through an export: `deploy.hf_export`)."""
    config = compiled.config
    mounts = _mounts(compiled, job_dir=job_dir if launcher == "srun-containers" else None)
    plans: list[DeploymentPlan] = []
    for role, section in deployed_roles(config):
        plans.append(
            _deployment_plan(
                compiled,
                role,
                section,
                invocation=invocation,
                job_dir=job_dir,
                toolchain=toolchain,
                launcher=launcher,
                mounts=mounts,
                pinned=pinned if role.evaluated else None,
                checkpoint_layout=checkpoint_layout if role.evaluated else None,
                # on Slurm each role's server has nodes of its own, after those of the roles before it
                node_offset=sum(p.step.nodes for p in plans if p.step) if launcher == "srun-containers" else 0,
            )
        )
    dep_plan, others = plans[0], tuple(plans[1:])
    base_url = f"http://127.0.0.1:{dep_plan.port}" if dep_plan.port is not None else None
    judge_plan = next((p for p in others if p.role == JUDGE), None)

    tasks = tuple(
        _task_plan(
            compiled,
            task,
            base_url=base_url,
            job_dir=job_dir,
            toolchain=toolchain,
            launcher=launcher,
            mounts=mounts,
            deployment_plan=dep_plan,
            judge_plan=judge_plan,
        )
        for task in compiled.tasks
    )
    env = {**_execution_env(compiled), "HF_HUB_DISABLE_TELEMETRY": "1", "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0"}
    parallel = parallel_tasks(config.evaluation.max_parallel_tasks, len(tasks))
    return JobPlan(
        invocation=invocation,
        job_dir=job_dir,
        deployment=dep_plan,
        tasks=tasks,
        env=env,
        max_parallel_tasks=parallel,
        prepare_during_load=config.evaluation.prepare_during_load,
        clients_need=_prepared_by_deployment(compiled) + _published_by_deployment(compiled, job_dir),
        requests=_request_groups(
            compiled, tasks, parallel=parallel, job_dir=job_dir, toolchain=toolchain, deployment=dep_plan
        ),
        others=others,
    )


def _deployment_plan(
    compiled: CompiledConfig,
    role: Role,
    deployment: Any,
    *,
    invocation: str,
    job_dir: str,
    toolchain: Toolchain,
    launcher: Launcher,
    mounts: tuple[str, ...],
    pinned: str | None,
    node_offset: int = 0,
    checkpoint_layout: str | None = None,
) -> DeploymentPlan:
    """How the job serves `role` with `deployment` (its config section): its step, port, identity, files;
    with a `node_offset`, on nodes of its own after the job's first `node_offset` (reached at its node's name)."""
    readiness = compiled.config.execution.endpoint_readiness_timeout
    if isinstance(deployment, NoDeployment):
        return DeploymentPlan(kind="none", step=None, health_url=None, readiness_timeout=readiness, role=role.name)
    from ckpteval.server.identity import new_identity

    backend = backend_for(deployment)
    port = deployment.port
    base_url = f"http://127.0.0.1:{port}"
    identity = new_identity(invocation) if backend.reports_identity else None
    # a backend that holds its own port takes it when it starts (the planned one, or any free one if that is
    # taken: no race with another job, or another role, on the machine) and writes it here for the job
    # (so does one loaded into a kept server: it answers on that server's port, which its step writes)
    loads_into = bool(getattr(deployment, "load_into", None))
    port_file = JobDir(job_dir).join(role.port_file) if backend.holds_port or loads_into else None
    # vLLM/SGLang on a Megatron checkpoint (the evaluated model's): the job exports it first
    export = (
        _export_step(compiled, job_dir, toolchain, launcher, mounts, pinned, checkpoint_layout)
        if role.evaluated
        else None
    )
    step, kind = _deployment_step(
        compiled,
        deployment,
        role,
        backend,
        port=port,
        toolchain=toolchain,
        launcher=launcher,
        mounts=mounts,
        job_dir=job_dir,
        identity=identity,
        port_file=port_file,
        pinned=pinned,
        host="0.0.0.0" if node_offset else "127.0.0.1",
        exported=export is not None,
    )
    if node_offset:
        step = dataclasses.replace(step, node_offset=node_offset)
    health_url = base_url + deployment.endpoints.health
    return DeploymentPlan(
        kind=kind,
        step=step,
        health_url=health_url,
        readiness_timeout=readiness,
        port=port,
        identity=identity,
        identity_url=_identity_url(backend, base_url, health_url) if identity else None,
        port_file=port_file,
        pinned_iteration=pinned,
        # an export step is given the pinned iteration itself: the engine serves the export, not the tracker's
        pinned_tracker=None
        if export is not None
        else _pinned_tracker(
            getattr(deployment, "checkpoint_path", None), pinned, takes_iteration=backend.takes_iteration
        ),
        names_answers=bool(identity) and backend.reports_checkpoint,
        role=role.name,
        served_model_name=getattr(deployment, "served_model_name", None),
        host_var=f"{role.var}_HOST" if node_offset else None,
        export_step=export,
    )


def _identity_url(backend: Any, base_url: str, health_url: str) -> str:
    """Where the deployment reports the job's identity: its health route, or the backend's own route."""
    route = IDENTITY_ROUTES.get(backend.identity_route or "")
    return base_url + route if route else health_url


def _request_groups(
    compiled: CompiledConfig,
    tasks: tuple[TaskPlan, ...],
    *,
    parallel: int,
    job_dir: str,
    toolchain: Toolchain,
    deployment: DeploymentPlan,
) -> RequestGroups | None:
    """The tasks grouped by request settings, with the probe that decides whether the groups take turns (run
    by the job script, from the hook directory: none there, no probe and no grouping)."""
    from ckpteval.job.request_groups import plan_groups, probe_command

    if toolchain.hook_dir is None or not tasks:
        return None
    urls: dict[str, str] = {}
    for resolved, task in zip(compiled.tasks, tasks, strict=True):
        # on the port the deployment published, as the clients reach it
        url = deployment.on_published_port(task.endpoint_url)
        urls.setdefault("chat" if resolved.endpoint_type == "chat" else "completions", url)
    api = compiled.config.target.api_endpoint
    probe = probe_command(
        toolchain.script_python,
        toolchain.hook_dir,
        urls=urls,
        model_id=api.model_id,
        api_key_name=api.api_key_name,
        out=JobDir(job_dir).join(JobDir.REQUEST_PROBE),
    )
    return plan_groups(
        compiled.tasks,
        parallel=parallel,
        probe=probe,
        known_mixing=_known_mixing(compiled),
        # the job owns the endpoint when its deployment reports the job's identity (`owns_endpoint`)
        shared=deployment.identity is None,
    )


def owns_endpoint(compiled: CompiledConfig) -> bool:
    """Whether the endpoint is the job's own: a deployment it starts that reports the job's identity (the
    builtin server, vLLM, SGLang). An existing endpoint (`none`), a generic command (it may front a shared server)
    and Export-Deploy (it cannot report an identity) may answer other clients in the same batches."""
    deployment = compiled.config.deployment
    return not isinstance(deployment, NoDeployment) and _reports_identity(deployment)


def _known_mixing(compiled: CompiledConfig) -> str:
    """Why the deployment is known to mix request settings across a batch before any probe (Export-Deploy's
    entry point, unprobed, is the 0.5+ layout: `with_entry_point` puts in what the image really has)."""
    deployment = compiled.config.deployment
    if isinstance(deployment, NoDeployment):
        return ""
    known_mixing = backend_for(deployment).known_mixing
    return known_mixing(deployment) if known_mixing else ""


def _execution_env(compiled: CompiledConfig) -> dict[str, str]:
    return dict(compiled.config.execution.env_vars)


def _prepared_by_deployment(compiled: CompiledConfig) -> tuple[str, ...]:
    """The checkpoint, when the deployment step prepares it (`deployment.prepare`): it appears, complete,
    only then (renamed into place), and the clients read its tokenizer (and mount it, on Slurm)."""
    deployment = compiled.config.deployment
    checkpoint = getattr(deployment, "checkpoint_path", None)
    return (checkpoint,) if checkpoint and getattr(deployment, "prepare", None) is not None else ()


def _published_by_deployment(compiled: CompiledConfig, job_dir: str) -> tuple[str, ...]:
    """The tokenizer the builtin server publishes in the job directory, when the clients read it there."""
    path = published_tokenizer(compiled, job_dir)
    return (path,) if path else ()


def published_tokenizer(compiled: CompiledConfig, job_dir: str) -> str | None:
    """Where the builtin server writes the tokenizer it serves with (a Hugging Face directory), for the task
    clients; None for other deployments. The checkpoint may name its tokenizer only in its args (a SentencePiece
    model, a GPT-2 vocabulary, a TikToken file): the server turns it into that directory first."""
    deployment = compiled.config.deployment
    if isinstance(deployment, NoDeployment):
        return None
    return _tokenizer_published_by(backend_for(deployment), job_dir)


def _tokenizer_published_by(backend: DeploymentBackend, job_dir: str) -> str | None:
    return JobDir(job_dir).join(JobDir.TOKENIZER) if backend.publishes_tokenizer else None


def client_tokenizer(compiled: CompiledConfig, job_dir: str) -> str | None:
    """What the task clients load as the tokenizer when `deployment.tokenizer` is `from-checkpoint`: the
    builtin's published directory, else the checkpoint's own tokenizer/ directory (Export-Deploy)."""
    deployment = compiled.config.deployment
    if not isinstance(deployment, MegatronDeployment) or deployment.tokenizer != FROM_CHECKPOINT:
        return None
    return published_tokenizer(compiled, job_dir) or f"{deployment.checkpoint_path.rstrip('/')}/tokenizer"


def _mounts(compiled: CompiledConfig, *, job_dir: str | None) -> tuple[str, ...]:
    """Container mounts on Slurm: the job directory (run configs, outputs, logs, the hook), the profile's,
    execution.mounts, and each deployment's checkpoint (the model's, a judge's) at the same path (so paths in the
    config, like the tokenizer dir, mean the same inside and outside) — read-only, unless it is to be prepared
    there first."""
    config = compiled.config
    out: list[str] = [f"{job_dir}:{job_dir}"] if job_dir else []
    out.extend(compiled.profile.part.step_mounts())
    out.extend(f"{src}:{dst}" for src, dst in config.execution.container_mounts().items())
    for _role, deployment in deployed_roles(config):
        checkpoint = getattr(deployment, "checkpoint_path", None)
        if checkpoint:
            prepared_here = getattr(deployment, "prepare", None) is not None
            out.append(f"{checkpoint}:{checkpoint}" if prepared_here else f"{checkpoint}:{checkpoint}:ro")
    return tuple(dict.fromkeys(out))


def _export_step(
    compiled: CompiledConfig,
    job_dir: str,
    toolchain: Toolchain,
    launcher: Launcher,
    mounts: tuple[str, ...],
    pinned: str | None,
    layout: str | None,
) -> Step | None:
    """The step that exports a Megatron checkpoint for vLLM/SGLang before the engine starts, if it needs one."""
    from ckpteval.job.hf_export import export_step, needs_export

    if not needs_export(compiled, layout=layout):
        return None
    containers = launcher == "srun-containers"
    return export_step(
        compiled, job_dir=job_dir, python=toolchain.python, containers=containers, mounts=mounts, pinned=pinned
    )


def _deployment_step(
    compiled: CompiledConfig,
    deployment: Any,
    role: Role,
    backend: DeploymentBackend,
    *,
    port: int,
    toolchain: Toolchain,
    launcher: Launcher,
    mounts: tuple[str, ...],
    job_dir: str,
    identity: str | None,
    port_file: str | None,
    pinned: str | None,
    host: str = "127.0.0.1",
    exported: bool = False,
) -> tuple[Step, str]:
    """`role`'s deployment step, as its registered `backend` (the one `_deployment_plan` resolved) launches it,
    and the backend's kind. Only the model's server publishes its tokenizer (the task clients read it).
    `exported`: it serves the export step's directory (which its container mounts), not the checkpoint."""
    from ckpteval.job.hf_export import engine_mounts, served_link

    if exported:
        mounts = (*mounts, *engine_mounts(compiled))
    context = LaunchContext(
        python=toolchain.python,
        port=port,
        identity=identity,
        port_file=port_file,
        publish_tokenizer=_tokenizer_published_by(backend, job_dir) if role.evaluated else None,
        containers=launcher == "srun-containers",
        iteration=pinned if backend.takes_iteration else None,
        report_file=JobDir(job_dir).join(role.served_file) if backend.reports_checkpoint else None,
        host=host,
        served_dir=served_link(job_dir) if exported else None,
    )
    launch = backend.launch(deployment, context)
    env = dict(getattr(deployment, "env_vars", {}) or {})
    step = Step(
        command=launch.command,
        env=env,
        image=launch.image,
        mounts=mounts if launch.mounted else (),
        nodes=launch.nodes,
    )
    return step, backend.kind


def _task_plan(
    compiled: CompiledConfig,
    task: ResolvedTask,
    *,
    base_url: str | None,
    job_dir: str,
    toolchain: Toolchain,
    launcher: Launcher,
    mounts: tuple[str, ...],
    deployment_plan: DeploymentPlan,
    judge_plan: DeploymentPlan | None = None,
) -> TaskPlan:
    from ckpteval.tasks.client import client_command, client_env
    from ckpteval.tasks.runconfig import EndpointSpec, build_run_config, client_hook_env

    config = compiled.config
    api = config.target.api_endpoint
    if base_url is None:
        url = endpoint_url_for(config, task.endpoint_type)
    else:
        route = getattr(config.deployment, "endpoints", None)
        assert route is not None, "a deployment with a base URL has routes"
        url = base_url + (route.chat if task.endpoint_type == "chat" else route.completions)
    routes = getattr(config.deployment, "endpoints", None)
    health = f"{base_url}{routes.health}" if base_url and routes else None
    endpoint = EndpointSpec(
        health_url=health,
        url=url,
        model_id=api.model_id,
        type=task.endpoint_type,  # type: ignore[arg-type]
        api_key_name=api.api_key_name,
    )
    task_dir = JobDir(job_dir).join(JobDir.task(task.dir_name))
    evaluator_config = _with_client_settings(
        task.evaluator_config,
        client_tokenizer(compiled, job_dir),
        token_ids=published_tokenizer(compiled, job_dir) is not None,  # the builtin server
    )
    if deployment_plan.export_step is not None:  # the clients read the export's tokenizer
        from ckpteval.job.hf_export import with_export_tokenizer

        evaluator_config = with_export_tokenizer(evaluator_config, compiled, job_dir)
    evaluator_config = _with_judge(compiled, task, evaluator_config, base_url=base_url, judge_plan=judge_plan)
    overrides = _judge_overrides(compiled, task, deployment_plan, judge_plan)
    env = {**client_env(offline_data=config.evaluation.offline_data, dataset_dir=task.dataset_dir), **task.env_vars}
    if task.spec.judge is not None and config.judge.type != "none":
        from ckpteval.tasks.harness_hook.ckpteval_judge import MAX_ERROR_RATE_ENV

        env.setdefault(MAX_ERROR_RATE_ENV, str(config.judge.max_error_rate))
        if judge_plan is not None and judge_plan.identity:
            env.update(_deployed_judge_env(judge_plan))
    if launcher == "processes" and not config.execution.on_cluster:  # this machine's dataset cache
        env.update(_local_cache_env(task))
    image = task.container if launcher == "srun-containers" else None
    runs = []
    for layout in task.layouts:
        request_params = dict(task.request_params)
        if layout.seed is not None:
            request_params["seed"] = layout.seed
        run_config = build_run_config(
            task.spec,
            evaluator_config,
            endpoint=endpoint,
            output_dir=f"{task_dir}/{layout.output}",
            request_params=request_params,
        )
        command = client_command(
            f"{task_dir}/{layout.run_config}",
            executable=toolchain.evaluator,
            hook_dir=toolchain.hook_dir,
            # on the port the deployment took when it started (the run config has the planned one)
            model_url=deployment_plan.on_published_port(url) if deployment_plan.port_file else None,
            overrides=overrides,
        )
        command = _with_judge_client(compiled, task, command, job_dir, toolchain, judge_plan)
        run_env = {**env, **client_hook_env(run_config, request_params)}
        step = Step(command=command, env=run_env, image=image, mounts=mounts if image else ())
        runs.append(TaskRun(run_config=run_config, step=step, layout=layout))
    return TaskPlan(name=task.name, dir_name=task.dir_name, runs=tuple(runs), endpoint_url=url, repeats=task.repeats)


# The variable a judge-scored task's harness reads the judge's key from, in the job: the job sets it from
# the owner-only file the key was staged into (`judge_key_file`), never from the script or the config.
JUDGE_API_KEY_ENV = "CKPTEVAL_JUDGE_API_KEY"
# A judge deployed beside the model: its base URL on the port it published, the identity the job gave it, how
# long its clients wait for it to load (the harness hook `ckpteval_judge` reads them; it spells them too)
JUDGE_URL_ENV = "CKPTEVAL_JUDGE_URL"
JUDGE_IDENTITY_ENV = "CKPTEVAL_JUDGE_IDENTITY"
JUDGE_WAIT_ENV = "CKPTEVAL_JUDGE_WAIT_S"
# where it reports that identity ("health": the builtin server's /v1/health; "models": a second served model
# name in /v1/models, vLLM's), and whether it names the deployment on every answer (the builtin server)
JUDGE_IDENTITY_ROUTE_ENV = "CKPTEVAL_JUDGE_IDENTITY_ROUTE"
JUDGE_ANSWERS_NAMED_ENV = "CKPTEVAL_JUDGE_ANSWERS_NAMED"


def _deployed_judge_env(judge_plan: DeploymentPlan) -> dict[str, str]:
    """What a judged task's client checks its deployed judge by (its URL is set by the command, on the port
    the judge published)."""
    route = "models" if (judge_plan.identity_url or "").endswith("/v1/models") else "health"
    return {
        JUDGE_IDENTITY_ENV: judge_plan.identity or "",
        JUDGE_WAIT_ENV: str(judge_plan.readiness_timeout),
        JUDGE_IDENTITY_ROUTE_ENV: route,
        JUDGE_ANSWERS_NAMED_ENV: "1" if judge_plan.names_answers else "0",
    }


def judge_key_file(job_dir: str) -> str:
    """Where the job finds the judge's API key (`.secrets/judge_api_key`, written owner-only at submission)."""
    return JobDir(job_dir).join(f"{JobDir.SECRETS}/judge_api_key")


def _judge_endpoint(compiled: CompiledConfig, *, base_url: str | None, judge_plan: DeploymentPlan | None) -> Any:
    """The judge the tasks are told about (a `JudgeEndpoint`), or None when the config names none."""
    from ckpteval.tasks.judging import JudgeEndpoint

    judge = compiled.config.judge
    if judge_plan is not None and judge_plan.port is not None:  # deployed beside the model, on its planned port
        return JudgeEndpoint(url=f"http://127.0.0.1:{judge_plan.port}/v1", model_id=judge_plan.served_model_name or "")
    if judge.type == "api":
        return JudgeEndpoint(
            url=judge.url, model_id=judge.model_id, api_key_env=JUDGE_API_KEY_ENV if judge.api_key_name else None
        )
    if judge.type == "self":
        api = compiled.config.target.api_endpoint
        url = f"{base_url}/v1" if base_url else (api.url or "").split("/v1/", 1)[0] + "/v1"
        return JudgeEndpoint(url=url, model_id=api.model_id, api_key_env=api.api_key_name)
    return None


def _with_judge(
    compiled: CompiledConfig,
    task: ResolvedTask,
    evaluator_config: dict[str, Any],
    *,
    base_url: str | None,
    judge_plan: DeploymentPlan | None = None,
) -> dict[str, Any]:
    """A judge-scored task's evaluator config with `config.params.extra.judge` filled from the judge (the
    user's own values win); other tasks' as they are."""
    from ckpteval.tasks.judging import judge_params

    use = task.spec.judge
    endpoint = _judge_endpoint(compiled, base_url=base_url, judge_plan=judge_plan)
    if use is None or endpoint is None or not use.fillable:
        return evaluator_config
    params = (evaluator_config.get("config") or {}).get("params") or {}
    own = (params.get("extra") or {}).get("judge") or {}
    if not use.required and not own.get("enabled"):
        return evaluator_config  # it can use a judge, and the user did not turn its judge on
    out = copy.deepcopy(evaluator_config)
    extra = out.setdefault("config", {}).setdefault("params", {}).setdefault("extra", {})
    extra["judge"] = judge_params(use, endpoint, own)
    return out


def _judge_overrides(
    compiled: CompiledConfig, task: ResolvedTask, deployment: DeploymentPlan, judge_plan: DeploymentPlan | None
) -> dict[str, str]:
    """The judge URL on the port its server published at run time: a judge deployed beside the model (on the
    judge's port), or the model judging itself (on the model's)."""
    use = task.spec.judge
    if use is None or not use.fillable:
        return {}
    served = judge_plan if judge_plan is not None else deployment if compiled.config.judge.type == "self" else None
    if served is None or not (served.port_file or served.host_var):
        return {}
    own = ((task.evaluator_config.get("config") or {}).get("params") or {}).get("extra", {}).get("judge") or {}
    if "url" in own:
        return {}
    url = served.on_published_port(f"http://127.0.0.1:{served.port}/v1{use.route}")
    return {"config.params.extra.judge.url": url}


def _with_judge_client(
    compiled: CompiledConfig,
    task: ResolvedTask,
    command: str,
    job_dir: str,
    toolchain: Toolchain,
    judge_plan: DeploymentPlan | None = None,
) -> str:
    """A task's command with what its API judge needs: the key read from its owner-only file into
    JUDGE_API_KEY_ENV, and, for a judged task, a check before its harness sends anything that the judge
    serves the model named (`/v1/models`, with that key): the judge's identity, as the job checks the model's.
    A judge deployed beside the model is waited for (its health), then checked the same way and for the
    identity the job gave it. (The evaluated model judging itself was verified by the job's health wait.)"""
    import shlex

    judge = compiled.config.judge
    if judge_plan is not None:
        if task.spec.judge is None or toolchain.hook_dir is None or judge_plan.port is None:
            return command
        url = judge_plan.on_published_port(f"http://127.0.0.1:{judge_plan.port}/v1")
        check = shlex.join([toolchain.script_python, f"{toolchain.hook_dir}/ckpteval_judge.py", "check"])
        model_id = shlex.quote(judge_plan.served_model_name or "")
        return f'export {JUDGE_URL_ENV}="{url}"; {check} "${JUDGE_URL_ENV}" {model_id} && {command}'
    if judge.type != "api":
        return command
    prefix = ""
    if judge.api_key_name:
        prefix = f'export {JUDGE_API_KEY_ENV}="$(cat {shlex.quote(judge_key_file(job_dir))})"; '
    if task.spec.judge is None or toolchain.hook_dir is None:
        return prefix + command
    argv = [toolchain.script_python, f"{toolchain.hook_dir}/ckpteval_judge.py", "check", judge.url, judge.model_id]
    if judge.api_key_name:
        argv.append(JUDGE_API_KEY_ENV)
    return f"{prefix}{shlex.join(argv)} && {command}"


def _local_cache_env(task: ResolvedTask) -> dict[str, str]:
    """On this machine, a task whose datasets are all in the dataset cache (`evaluate data fetch`) reads them
    there with the hub off. (One that needs the hub when it does not answer is refused before the job is
    written: `ckpteval.execution.pipeline.refuse_hubless`.)"""
    from ckpteval.tasks.data_cache import default_cache_dir, is_cached, offline_env
    from ckpteval.tasks.datasets import task_data

    root = default_cache_dir()
    if not (root / "ckpteval").is_dir():
        return {}  # nothing fetched: the harness downloads as usual (or the hook serves packaged data)
    data = task_data(task.spec)
    if data.datasets and all(is_cached(root, ref) for ref in data.datasets):
        return offline_env(str(root))
    return {}


def _with_client_settings(
    evaluator_config: dict[str, Any], tokenizer: str | None, *, token_ids: bool
) -> dict[str, Any]:
    """The task's evaluator config as its client runs it: `from-checkpoint` (deployment.tokenizer's default)
    replaced by the directory the clients load; with `token_ids`, lm-eval sends the token ids it counted
    (`tokenized_requests`) instead of text the server would tokenize again.

    Why token ids: lm-eval reads a continuation's log-probabilities at the positions its own tokenization
    gives. From text, a server tokenizes again, and a tokenizer that adds a BOS token (Llama-2's, Llama-3's)
    or a context lm-eval cut to fit the model (whose first word then splits differently) shifts those
    positions by one: every score silently wrong, or a prompt one token over the context. The builtin
    server accepts token-id prompts; nemo-evaluator's default (text) stays for other deployments."""
    extra = ((evaluator_config.get("config") or {}).get("params") or {}).get("extra")
    if not isinstance(extra, dict) or "tokenizer_backend" not in extra:
        return evaluator_config  # not an lm-eval task with a tokenizer
    changes: dict[str, Any] = {}
    if tokenizer is not None and extra.get("tokenizer") == FROM_CHECKPOINT:
        changes["tokenizer"] = tokenizer
    if token_ids and "tokenized_requests" not in extra:
        changes["tokenized_requests"] = True
    if not changes:
        return evaluator_config
    out = copy.deepcopy(evaluator_config)
    out["config"]["params"]["extra"].update(changes)
    return out
