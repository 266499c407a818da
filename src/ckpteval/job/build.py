"""Make a `JobPlan` from a compiled config: which command serves the model, which client runs each task.

The deployment's command, and what the job may rely on it for (its identity, its own port, a published
tokenizer), come from its registered backend (`ckpteval.deploy.backends`); none: nothing (an endpoint runs).
Task clients are what the launcher runs in each eval-factory container: `nemo-evaluator run_eval`.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.config.compile import CompiledConfig, ResolvedTask, endpoint_url_for
from ckpteval.config.executors import Launcher
from ckpteval.config.schema import FROM_CHECKPOINT, MegatronDeployment, NoDeployment
from ckpteval.deploy.backends import LaunchContext, backend_for
from ckpteval.invocation.jobdir import JobDir
from ckpteval.job.plan import DeploymentPlan, JobPlan, RequestGroups, Step, TaskPlan, TaskRun, parallel_tasks

HOOK_SUBDIR = JobDir.HOOK


@dataclass(frozen=True)
class Toolchain:
    """Where the job finds ckpteval's Python and the harness client (differs between here and a cluster)."""

    python: str  # runs `-m ckpteval.server` (builtin deployment)
    evaluator: str  # the nemo-evaluator executable (inside the eval-factory image: "nemo-evaluator")
    hook_dir: str | None = None  # offline-data hook for the harness (None: not available there)
    # runs the hook directory's standard-library scripts in the job script itself (the request-settings probe)
    script_python: str = "python3"


def slurm_toolchain(python: str, job_dir: str) -> Toolchain:
    """A cluster: the profile's Python (builtin deployment), `nemo-evaluator` as the eval-factory image has
    it, and the offline-data hook uploaded into the job directory (`<job_dir>/hook`, mounted with it)."""
    return Toolchain(python=python, evaluator="nemo-evaluator", hook_dir=f"{job_dir}/{HOOK_SUBDIR}")


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
    as a second served model name, listed by /v1/models). Export-Deploy and a generic command cannot: their
    endpoints are recorded as unverified."""
    return backend_for(deployment).reports_identity


def _pinned_tracker(deployment: object, pinned: str | None) -> str | None:
    """The tracker file the job checks still names the pinned iteration before it starts a deployment that
    reads the tracker itself (Export-Deploy takes a root, not an iteration); None when the deployment is
    given the iteration, or nothing is pinned."""
    from ckpteval.checkpoint.layout import TRACKER_FILE

    checkpoint = getattr(deployment, "checkpoint_path", None)
    if pinned is None or not checkpoint or backend_for(deployment).takes_iteration:
        return None
    return f"{checkpoint.rstrip('/')}/{TRACKER_FILE}"


def _port_file(deployment: object, job_dir: str) -> str | None:
    """A backend that holds its own port takes it when it starts (the planned one, or any free one if that is
    taken: no race with another job on the machine) and writes it here for the job."""
    return JobDir(job_dir).join(JobDir.DEPLOYMENT_PORT) if backend_for(deployment).holds_port else None


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
    deployment = config.deployment
    readiness = config.execution.endpoint_readiness_timeout
    mounts = _mounts(compiled, job_dir=job_dir if launcher == "srun-containers" else None)

    if isinstance(deployment, NoDeployment):
        dep_plan = DeploymentPlan(kind="none", step=None, health_url=None, readiness_timeout=readiness)
        base_url = None
    else:
        from ckpteval.server.identity import new_identity

        port = deployment.port
        base_url = f"http://127.0.0.1:{port}"
        identity = new_identity(invocation) if _reports_identity(deployment) else None
        port_file = _port_file(deployment, job_dir)
        export = _export_step(compiled, job_dir, toolchain, launcher, mounts, pinned, checkpoint_layout)
        step, kind = _deployment_step(
            compiled,
            port=port,
            toolchain=toolchain,
            launcher=launcher,
            mounts=mounts,
            job_dir=job_dir,
            identity=identity,
            port_file=port_file,
            pinned=pinned,
            exported=export is not None,
        )
        health_url = base_url + deployment.endpoints.health
        dep_plan = DeploymentPlan(
            kind=kind,
            step=step,
            health_url=health_url,
            readiness_timeout=readiness,
            port=port,
            identity=identity,
            identity_url=(base_url + "/v1/models" if backend_for(deployment).identity_route == "models" else health_url)
            if identity
            else None,
            port_file=port_file,
            pinned_iteration=pinned,
            pinned_tracker=_pinned_tracker(deployment, pinned),
            names_answers=bool(identity) and backend_for(deployment).reports_checkpoint,
            export_step=export,
        )

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
    )


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
        shared=not owns_endpoint(compiled),
    )


def owns_endpoint(compiled: CompiledConfig) -> bool:
    """Whether the endpoint is the job's own: a deployment it starts that reports the job's identity (the
    builtin server, vLLM). An existing endpoint (`none`), a generic command (it may front a shared server)
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
    if not isinstance(deployment, NoDeployment) and backend_for(deployment).publishes_tokenizer:
        return JobDir(job_dir).join(JobDir.TOKENIZER)
    return None


def client_tokenizer(compiled: CompiledConfig, job_dir: str) -> str | None:
    """What the task clients load as the tokenizer when `deployment.tokenizer` is `from-checkpoint`: the
    builtin's published directory, else the checkpoint's own tokenizer/ directory (Export-Deploy)."""
    deployment = compiled.config.deployment
    if not isinstance(deployment, MegatronDeployment) or deployment.tokenizer != FROM_CHECKPOINT:
        return None
    return published_tokenizer(compiled, job_dir) or f"{deployment.checkpoint_path.rstrip('/')}/tokenizer"


def _mounts(compiled: CompiledConfig, *, job_dir: str | None) -> tuple[str, ...]:
    """Container mounts on Slurm: the job directory (run configs, outputs, logs, the hook), the profile's,
    execution.mounts, and the checkpoint at the same path (so paths in the config, like the tokenizer dir,
    mean the same inside and outside) — read-only, unless it is to be prepared there first."""
    config = compiled.config
    out: list[str] = [f"{job_dir}:{job_dir}"] if job_dir else []
    out.extend(compiled.profile.mounts)
    out.extend(f"{src}:{dst}" for src, dst in config.execution.container_mounts().items())
    checkpoint = getattr(config.deployment, "checkpoint_path", None)
    if checkpoint:
        prepared_here = getattr(config.deployment, "prepare", None) is not None
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
    *,
    port: int,
    toolchain: Toolchain,
    launcher: Launcher,
    mounts: tuple[str, ...],
    job_dir: str,
    identity: str | None,
    port_file: str | None,
    pinned: str | None,
    exported: bool = False,
) -> tuple[Step, str]:
    """The deployment's step, as its registered backend launches it, and the backend's kind; `exported`: it
    serves the export step's directory (which its container mounts), not the checkpoint."""
    from ckpteval.job.hf_export import engine_mounts, served_link

    deployment = compiled.config.deployment
    backend = backend_for(deployment)
    if exported:
        mounts = (*mounts, *engine_mounts(compiled))
    context = LaunchContext(
        python=toolchain.python,
        port=port,
        identity=identity,
        port_file=port_file,
        publish_tokenizer=published_tokenizer(compiled, job_dir),
        containers=launcher == "srun-containers",
        iteration=pinned if backend.takes_iteration else None,
        report_file=JobDir(job_dir).join(JobDir.SERVED_CHECKPOINT) if backend.reports_checkpoint else None,
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
    evaluator_config = _with_judge(compiled, task, evaluator_config, base_url=base_url)
    overrides = _judge_overrides(compiled, task, deployment_plan)
    env = {**client_env(offline_data=config.evaluation.offline_data, dataset_dir=task.dataset_dir), **task.env_vars}
    if task.spec.judge is not None and config.judge.type != "none":
        from ckpteval.tasks.harness_hook.ckpteval_judge import MAX_ERROR_RATE_ENV

        env.setdefault(MAX_ERROR_RATE_ENV, str(config.judge.max_error_rate))
    if launcher == "processes":
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
        command = _with_judge_client(compiled, task, command, job_dir, toolchain)
        run_env = {**env, **client_hook_env(run_config, request_params)}
        step = Step(command=command, env=run_env, image=image, mounts=mounts if image else ())
        runs.append(TaskRun(run_config=run_config, step=step, layout=layout))
    return TaskPlan(name=task.name, dir_name=task.dir_name, runs=tuple(runs), endpoint_url=url, repeats=task.repeats)


# The variable a judge-scored task's harness reads the judge's key from, in the job: the job sets it from
# the owner-only file the key was staged into (`judge_key_file`), never from the script or the config.
JUDGE_API_KEY_ENV = "CKPTEVAL_JUDGE_API_KEY"


def judge_key_file(job_dir: str) -> str:
    """Where the job finds the judge's API key (`.secrets/judge_api_key`, written owner-only at submission)."""
    return JobDir(job_dir).join(f"{JobDir.SECRETS}/judge_api_key")


def _judge_endpoint(compiled: CompiledConfig, *, base_url: str | None) -> Any:
    """The judge the tasks are told about (a `JudgeEndpoint`), or None when the config names none."""
    from ckpteval.tasks.judging import JudgeEndpoint

    judge = compiled.config.judge
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
    compiled: CompiledConfig, task: ResolvedTask, evaluator_config: dict[str, Any], *, base_url: str | None
) -> dict[str, Any]:
    """A judge-scored task's evaluator config with `config.params.extra.judge` filled from the judge (the
    user's own values win); other tasks' as they are."""
    from ckpteval.tasks.judging import judge_params

    use = task.spec.judge
    endpoint = _judge_endpoint(compiled, base_url=base_url)
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


def _judge_overrides(compiled: CompiledConfig, task: ResolvedTask, deployment: DeploymentPlan) -> dict[str, str]:
    """When the model judges itself on the port it published at run time, the judge URL on that port."""
    use = task.spec.judge
    if compiled.config.judge.type != "self" or use is None or not use.fillable or not deployment.port_file:
        return {}
    own = ((task.evaluator_config.get("config") or {}).get("params") or {}).get("extra", {}).get("judge") or {}
    if "url" in own:
        return {}
    url = deployment.on_published_port(f"http://127.0.0.1:{deployment.port}/v1{use.route}")
    return {"config.params.extra.judge.url": url}


def _with_judge_client(
    compiled: CompiledConfig, task: ResolvedTask, command: str, job_dir: str, toolchain: Toolchain
) -> str:
    """A task's command with what its API judge needs: the key read from its owner-only file into
    JUDGE_API_KEY_ENV, and, for a judged task, a check before its harness sends anything that the judge
    serves the model named (`/v1/models`, with that key): the judge's identity, as the job checks the model's.
    (The evaluated model judging itself was verified by the job's health wait.)"""
    import shlex

    judge = compiled.config.judge
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
