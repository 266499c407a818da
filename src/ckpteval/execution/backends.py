"""The job backend of an executor: the registered executor's backend class (`ckpteval.config.executors`),
imported here on first use, so that `evaluate --help` and `--dry-run` load only the backend they use."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from ckpteval.config.executors import find_executor
from ckpteval.errors import ConfigError

if TYPE_CHECKING:
    from ckpteval.config.profiles import Profile
    from ckpteval.execution.backend import HostsScripts, JobBackend, ScriptHost


def backend_for(executor: str) -> JobBackend:
    """The job backend of `executor` (a profile's, or a record's)."""
    module, _, name = find_executor(executor).backend.partition(":")
    backend: JobBackend = getattr(importlib.import_module(module), name)()
    return backend


def script_host(profile: Profile) -> ScriptHost:
    """Where `profile`'s executor runs scripts of ours outside any invocation (the cluster-hosted watcher),
    connected; ConfigError, before anything is contacted, for an executor that hosts no watchers."""
    if not find_executor(profile.executor).hosts_watchers:
        raise ConfigError(
            f"Profile [{profile.name}]: executor {profile.executor!r} cannot host a watcher (--detach).",
            hint="Name a profile whose executor runs jobs on a cluster (e.g. Slurm) with --run, or drop --detach.",
        )
    return cast("HostsScripts", backend_for(profile.executor)).host_scripts(profile)
