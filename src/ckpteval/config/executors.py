"""The executors an env.toml profile can name (`executor = "..."`): the one registry of where jobs run.

Each entry says which job backend runs its jobs (a `module:attribute` path, imported only when a job is
planned or acted on: `ckpteval.execution.backends.backend_for`), which packaged `execution` config it
selects, how its job scripts start their steps (`Launcher`), and the few traits the code before a backend
asks about: whether its jobs run on a cluster reached through the profile's tunnel (their files, checkpoints
and save dirs are there; images are squashed and datasets staged there), whether its backend hosts the
watcher of `evaluate watch --detach` there, and how `evaluate watch` paces itself.
Nothing else in ckpteval names an executor: a new one is its backend module and one `register_executor`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ckpteval.config.schema import register_execution_section
from ckpteval.errors import ConfigError, did_you_mean
from ckpteval.registry import Registry

# How a job script starts its steps (`ckpteval.job.script` renders each): as processes of the job on this
# machine, or as `srun` steps in their containers inside a Slurm allocation. An executor's backend uses one.
Launcher = Literal["processes", "srun-containers"]


@dataclass(frozen=True)
class Executor:
    """One place jobs run."""

    name: str
    backend: str  # "package.module:Class", a JobBackend made with no arguments
    config_group: str  # the packaged conf/execution option a profile of this executor selects
    launcher: Launcher  # how its job scripts start their steps
    on_cluster: bool  # jobs run on a cluster reached through the profile's tunnel (`host`, `remote_job_dir`)
    watch_max_pending: int  # `evaluate watch`: evaluations submitted and not yet ended, by default
    watch_follow_every: float  # `evaluate watch`: seconds between status queries, by default
    hosts_watchers: bool = False  # its backend runs the cluster-hosted watcher (`host_scripts`: --detach)
    section: type | None = None  # its `execution` config section, registered with it (shipped: in config.schema)


def _register_section(executor: Executor) -> None:
    if executor.section is not None:
        register_execution_section(executor.section)


EXECUTORS: Registry[Executor] = Registry(
    "executor", entry_type=Executor, key=lambda e: e.name, group="executors", on_register=_register_section
)


def register_executor(executor: Executor) -> Executor:
    """Make `executor` nameable in env.toml (a later registration of the same name replaces it)."""
    return EXECUTORS.register(executor)


def unregister_executor(name: str) -> None:
    """Forget an executor (a test's, when the test ends)."""
    EXECUTORS.unregister(name)


def executor_names() -> list[str]:
    """The executors a profile can name, in registration order (installed plugins' included)."""
    return EXECUTORS.names()


def find_executor(name: str, *, where: str = "env.toml") -> Executor:
    """The registered executor `name`; ConfigError naming the ones that exist otherwise."""
    found = EXECUTORS.get(name)
    if found is None:
        names = EXECUTORS.names()
        allowed = ", ".join(repr(n) for n in names)
        raise ConfigError(
            f"{where}: 'executor' is {name!r}; it must be one of {allowed}." + did_you_mean(name, names),
            hint=f"An executor from a package is found once it is installed (entry point group {EXECUTORS.group}).",
        )
    return found


def cluster_executors() -> list[str]:
    """The executors whose jobs run on another machine (for messages that say which to pick)."""
    return [e.name for e in EXECUTORS.entries() if e.on_cluster]


# a status query costs a file read here, an SSH round trip with a Slurm query on a cluster
register_executor(
    Executor(
        name="local",
        backend="ckpteval.execution.local:LocalBackend",
        config_group="local",
        launcher="processes",
        on_cluster=False,
        watch_max_pending=1,
        watch_follow_every=5.0,
    )
)
register_executor(
    Executor(
        name="slurm",
        backend="ckpteval.execution.slurm:SlurmBackend",
        config_group="slurm/default",
        launcher="srun-containers",
        on_cluster=True,
        watch_max_pending=4,
        watch_follow_every=30.0,
        hosts_watchers=True,
    )
)
# a status query costs an SSH round trip (no scheduler: the job's process and its state files)
register_executor(
    Executor(
        name="ssh",
        backend="ckpteval.execution.ssh:SshBackend",
        config_group="ssh",
        launcher="processes",
        on_cluster=True,
        watch_max_pending=1,
        watch_follow_every=10.0,
    )
)
