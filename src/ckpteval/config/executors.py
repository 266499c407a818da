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

from dataclasses import dataclass, field
from typing import Any, Literal

from ckpteval.config.profile_types import ExecutorProfile, Profile
from ckpteval.config.schema import register_execution_section
from ckpteval.errors import ConfigError, did_you_mean
from ckpteval.registry import Registry

# How a job script starts its steps (`ckpteval.job.script` renders each): as processes of the job on this
# machine, or as `srun` steps in their containers inside a Slurm allocation. An executor's backend uses one.
Launcher = Literal["processes", "srun-containers"]


@dataclass(frozen=True, kw_only=True)
class LocalProfile(ExecutorProfile):
    """This machine's keys (`executor = "local"`): none but how it is reached, which is here."""

    tunnel: Literal["local"] = "local"


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
    # its env.toml keys, a dataclass of them (one that declares none takes this machine's: `tunnel = "local"`)
    profile: type[ExecutorProfile] = LocalProfile


@dataclass(frozen=True, kw_only=True)
class RemoteProfile(ExecutorProfile):
    """The keys of an executor whose jobs run on another machine reached over SSH (or this one, when the CLI runs
    there: `tunnel = "local"`), its files under `remote_job_dir` (the Slurm and ssh executors share them)."""

    # How to reach the machine: "ssh" from a laptop, "local" when the CLI runs on it (a login node).
    tunnel: Literal["ssh", "local"] = "ssh"
    host: str | None = None  # a hostname or a ~/.ssh/config alias
    user: str | None = None
    port: int | None = None
    identity: str | None = None  # private key file
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    remote_job_dir: str | None = None  # absolute, there: jobs, results, caches, staged datasets
    gpus_per_node: int = 8  # the GPUs of a node (a Slurm --gres request) or of the machine (ssh)
    env_vars: dict[str, str] = field(default_factory=dict)
    # The Python that runs ckpteval's own job steps there (the builtin deployment, the in-job task runner, the
    # export step); inside a container image that has ckpteval installed this is "python".
    python: str = "python3"
    # False: the machine cannot reach the internet; tasks read datasets staged in ${remote_job_dir}/datasets
    # (pushed at submission from the local dataset cache), and a task whose data is neither staged nor fetched
    # is refused before anything is submitted.
    compute_internet: bool = True

    def files_dir(self) -> str | None:
        return self.remote_job_dir

    def files_here(self) -> bool:
        return self.tunnel == "local"

    def step_python(self) -> str:
        return self.python

    def data_offline(self) -> bool:
        return not self.compute_internet


@dataclass(frozen=True, kw_only=True)
class SlurmProfile(RemoteProfile):
    """A Slurm cluster's keys (`executor = "slurm"`)."""

    account: str | None = None
    partition: str | None = None
    nodes: int = 1
    time: str = "04:00:00"
    container_image: str | None = None
    mounts: list[str] = field(default_factory=list)
    sbatch_flags: dict[str, Any] = field(default_factory=dict)
    # Squash (enroot import) on a compute node; None falls back to the run partition/time.
    build_partition: str | None = None
    build_time: str | None = None
    build_include_gpus: bool = False
    # The cluster-hosted watcher (`evaluate watch ... --detach`): a small CPU-only job (one CPU, no GPU)
    # that chains itself before its time limit. None falls back to partition / account / python.
    watch_partition: str | None = None
    watch_account: str | None = None
    watch_time: str = "04:00:00"
    watch_signal_lead: int = 300  # seconds before the time limit when it resubmits itself and exits
    watch_python: str | None = None  # the Python on the cluster with this version of ckpteval installed

    def step_image(self) -> str | None:
        return self.container_image

    def step_mounts(self) -> tuple[str, ...]:
        return tuple(self.mounts)


@dataclass(frozen=True, kw_only=True)
class SshProfile(RemoteProfile):
    """A GPU machine reached over SSH with no scheduler (`executor = "ssh"`): no images, no scheduler keys."""


def remote_part(profile: Profile) -> RemoteProfile:
    """`profile`'s keys as a machine reached over SSH (ConfigError for an executor whose jobs run here)."""
    from ckpteval.errors import ConfigError

    if not isinstance(profile.part, RemoteProfile):
        raise ConfigError(
            f"Profile [{profile.name}] (executor {profile.executor!r}) runs its jobs on this machine: it names no "
            "machine to reach.",
            hint="Name a profile of a machine reached over SSH (executor "
            + " or ".join(repr(e) for e in cluster_executors())
            + ").",
        )
    return profile.part


def slurm_part(profile: Profile) -> SlurmProfile:
    """`profile`'s keys as a Slurm cluster's (ConfigError naming the executor otherwise)."""
    from ckpteval.errors import ConfigError

    if not isinstance(profile.part, SlurmProfile):
        raise ConfigError(
            f"Profile [{profile.name}] has executor = {profile.executor!r}; this needs a Slurm cluster's profile.",
            hint='Name a profile with executor = "slurm".',
        )
    return profile.part


def _register_section(executor: Executor) -> None:
    if executor.section is not None:
        register_execution_section(executor.section)


# The executor of a profile that names none (env.toml profiles were Slurm clusters' before `executor` existed).
DEFAULT_EXECUTOR = "slurm"

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
        profile=SlurmProfile,
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
        profile=SshProfile,
    )
)
