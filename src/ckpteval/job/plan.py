"""The plan of one job: what it deploys, what it waits for, which task clients it runs, where files go.

A plan is plain data made from a compiled config; `ckpteval.job.script` renders it into the bash
script that runs on this machine or inside a Slurm allocation. Both places run the same steps:
deploy once, wait for health, run every task's client against the one deployment, stop it.

A job deploys one server per role (`ckpteval.job.roles`): the model's (`JobPlan.deployment`, the one the
task clients evaluate) and any other (`JobPlan.others`: a judge deployed beside it), each with its own
port, published port file, identity and log; `JobPlan.deployments` has them all, keyed by role.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from ckpteval.invocation.jobdir import JobDir
from ckpteval.invocation.record import TaskEntry
from ckpteval.tasks.repeats import RunLayout, run_layouts

# Task clients side by side when the config does not say (each is a few processes and ~1 GB of memory).
MAX_PARALLEL_TASKS = 8


def parallel_tasks(setting: int | None, n_tasks: int) -> int:
    """How many task clients run at once: `setting` (evaluation.max_parallel_tasks), by default all tasks
    up to MAX_PARALLEL_TASKS; never more than there are tasks, never less than 1."""
    wanted = setting if setting is not None else MAX_PARALLEL_TASKS
    return max(1, min(wanted, n_tasks))


@dataclass(frozen=True)
class Step:
    """A process the job starts: a bash command line, its environment, and (on Slurm) its container."""

    command: str
    env: dict[str, str] = field(default_factory=dict)
    image: str | None = None
    mounts: tuple[str, ...] = ()  # "host:container[:ro]"
    nodes: int = 1
    ntasks_per_node: int = 1
    # on Slurm, the job's nodes before this step's own (a judge deployed on nodes of its own, after the
    # model's); 0: from the job's first node on
    node_offset: int = 0


@dataclass(frozen=True)
class DeploymentPlan:
    """How the model is served for the whole job (`step` is None when an endpoint already runs)."""

    kind: str  # megatron/builtin, megatron/export-deploy, vllm, generic, none
    step: Step | None
    health_url: str | None
    readiness_timeout: int
    port: int | None = None
    # the token the deployment reports (`ckpteval.server.identity`) and the URL it reports it at; None where
    # the deployment cannot report one (export-deploy, generic, none): then nothing can be verified
    identity: str | None = None
    identity_url: str | None = None
    # where the deployment writes the port it holds (`port`, or another when that one was taken); the job
    # reads it before the clients start and gives them the URLs on that port (`DEPLOY_PORT`)
    port_file: str | None = None
    # the checkpoint iteration the job serves, resolved once when the checkpoint was described ("1000",
    # "release"; None: not described before the job); `pinned_tracker`: the tracker the job checks still
    # names it before starting a deployment that reads the tracker itself (one that does not take the iteration)
    pinned_iteration: str | None = None
    pinned_tracker: str | None = None
    # the deployment names itself and the checkpoint content it serves on every answer (the builtin server):
    # the task clients then refuse an answer that does not (`ckpteval_responses`)
    names_answers: bool = False
    role: str = "model"  # the role it plays (`ckpteval.job.roles`)
    served_model_name: str | None = None  # the model id it serves (a judge's: what the judged tasks send)
    # it runs on nodes of its own (`step.node_offset`): the job reaches it at the host in this shell variable
    # (its first node, set by the job script before it starts), not at 127.0.0.1
    host_var: str | None = None
    # run to its end before the deployment starts (its failure stops the job): vLLM's or SGLang's export of
    # a Megatron checkpoint (`ckpteval.job.hf_export`)
    export_step: Step | None = None

    @property
    def port_var(self) -> str:
        """The shell variable holding the port it published (`DEPLOY_PORT` for the model)."""
        from ckpteval.job.roles import role

        return role(self.role).port_var

    def on_published_port(self, url: str) -> str:
        """`url` (on the planned port) as the job reaches it: on the port the deployment published, when it
        publishes one (a shell expansion of $DEPLOY_PORT, or its role's variable, for a double-quoted word);
        at its node's name, when it runs on a node of its own (`host_var`)."""
        if self.port is None or (self.port_file is None and self.host_var is None):
            return url
        host = f"${{{self.host_var}}}" if self.host_var else "127.0.0.1"
        port = f"${{{self.port_var}}}" if self.port_file is not None else str(self.port)
        return url.replace(f"127.0.0.1:{self.port}", f"{host}:{port}", 1)


@dataclass(frozen=True)
class TaskRun:
    """One client run of a task: the task's only run (greedy), or one of its repeats."""

    run_config: dict[str, Any]  # nemo-evaluator's run config (written to tasks/<dir>/<layout.run_config>)
    step: Step
    layout: RunLayout = field(default_factory=RunLayout)


@dataclass(frozen=True)
class TaskPlan:
    """One task against the deployment: one client run, or one per repeat (`repeats` samples per problem).

    `repeats` is the compiled task's (it comes down from `-t NAME:K` or the config, never back up from
    the runs); `runs` has one run per layout of `run_layouts(repeats)`, in order.
    """

    name: str
    dir_name: str
    runs: tuple[TaskRun, ...]
    endpoint_url: str
    repeats: int = 0  # samples per problem; 0: greedy, one run

    def __post_init__(self) -> None:
        if self.layouts != run_layouts(self.repeats):
            raise ValueError(f"task {self.name}: runs {self.layouts} do not match {self.repeats} repeats")

    @property
    def dir(self) -> str:
        return JobDir.task(self.dir_name)

    @property
    def layouts(self) -> tuple[RunLayout, ...]:
        """Where each run keeps its files (output dir, run config, log, done marker), in run order."""
        return tuple(run.layout for run in self.runs)


@dataclass(frozen=True)
class RequestGroups:
    """Tasks whose requests carry identical settings, grouped (`ckpteval.job.request_groups` plans them).

    `groups` are indices into the plan's tasks, in the order they run, `words` each group's settings. With
    a `probe` (its shell command), the job probes the endpoint before any request, then opens the groups'
    turns all at once if it honours each request's settings, else one group after another; `known_mixing`
    says why the endpoint is known to mix settings (then one after another, whatever the probe says).
    No probe: the grouping can change nothing (one group, or one task at a time), nothing waits. `shared`:
    the job does not own the endpoint (`deployment=none`, generic, Export-Deploy), so it probes it whatever
    the groups, since other clients may share it.
    """

    groups: tuple[tuple[int, ...], ...]
    words: tuple[str, ...]
    probe: str = ""
    known_mixing: str = ""
    shared: bool = False

    @property
    def order(self) -> tuple[int, ...]:
        """The tasks in the order the job starts them: group by group."""
        return tuple(i for group in self.groups for i in group)


@dataclass(frozen=True)
class JobPlan:
    """Everything the job script needs."""

    invocation: str
    job_dir: str  # absolute path where the job runs (on the cluster for Slurm)
    deployment: DeploymentPlan
    tasks: tuple[TaskPlan, ...]
    env: dict[str, str] = field(default_factory=dict)  # for every step
    max_parallel_tasks: int = 1  # task clients running at once (`parallel_tasks`)
    prepare_during_load: bool = True  # clients start with the deployment, not once it is healthy
    # paths the deployment creates and the clients read (a checkpoint it prepares: its tokenizer): with
    # prepare_during_load the clients start once these exist
    clients_need: tuple[str, ...] = ()
    # shell lines run once the tasks are done and the deployment is stopped (the in-job export of a
    # detached cluster job); their failure never changes the job's outcome
    after_tasks: tuple[str, ...] = ()
    requests: RequestGroups | None = None  # tasks grouped by request settings; None: no grouping
    # the deployments of the other roles (a judge beside the model), in the registry's order
    others: tuple[DeploymentPlan, ...] = ()

    @property
    def deployments(self) -> dict[str, DeploymentPlan]:
        """Every deployment of the job, keyed by role, the model's first."""
        return {self.deployment.role: self.deployment, **{d.role: d for d in self.others}}

    def task(self, dir_name: str) -> TaskPlan:
        return next(t for t in self.tasks if t.dir_name == dir_name)


def quote_argv(argv: list[str]) -> str:
    """A shell command line from an argv list, every argument quoted."""
    return shlex.join(argv)


def task_entries(plan: JobPlan) -> list[TaskEntry]:
    """The record's task entries of a job plan (name, task dir, repeats)."""
    return [TaskEntry(name=t.name, dir=t.dir, repeats=t.repeats) for t in plan.tasks]
