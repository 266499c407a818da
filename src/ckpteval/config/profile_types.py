"""The neutral profile (`Profile`) and the base of an executor's part of it (`ExecutorProfile`).

A profile is an env.toml table (`ckpteval.config.profiles` reads the file); its executor's keys are a dataclass
that executor declares (`Executor.profile` in `ckpteval.config.executors`), held as `Profile.part`. This module
is below both, so the registry can name the part's base and the reader can build a profile.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ExecutorProfile:
    """The executor-owned part of a profile: the env.toml keys its executor reads, a dataclass that executor
    declares (`Executor.profile`), typed and validated with the rest of the profile. The neutral layers ask it
    the few questions below and read none of its fields; the answers here are a job's on this machine."""

    def files_dir(self) -> str | None:
        """Where the executor keeps jobs, results and caches on the machine its jobs run on (None: this one)."""
        return None

    def files_here(self) -> bool:
        """Whether those files are on this machine (the CLI runs where the jobs run)."""
        return True

    def step_python(self) -> str:
        """The Python that runs ckpteval's own job steps where the job runs (the in-job export step): on this
        machine, the one running ckpteval."""
        return sys.executable

    def step_image(self) -> str | None:
        """The container image ckpteval's own job steps run in (None: no container)."""
        return None

    def step_mounts(self) -> tuple[str, ...]:
        """The profile's own container mounts (host:container), for every containerized step."""
        return ()

    def data_offline(self) -> bool:
        """Whether the machine its jobs run on cannot reach a dataset hub (its datasets are staged there)."""
        return False


# The keys of every profile, whatever its executor; the rest are its executor's (`ExecutorProfile`).
NEUTRAL_KEYS = ("executor", "extends", "judge")


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Where and how an invocation runs: an env.toml profile. Its executor's keys are `part`, typed by the
    executor (`ckpteval.config.executors`), so nothing outside that executor reads them."""

    name: str
    executor: str  # a registered executor (`ckpteval.config.executors`)
    extends: str | None = None
    # The judge of judge-scored tasks run with this profile: a [judges.NAME] of the same env.toml
    # (`judge=...` on the command line names another).
    judge: str | None = None
    part: ExecutorProfile = field(default_factory=ExecutorProfile)  # the executor's own keys

    def to_config(self) -> dict[str, Any]:
        """The profile as the `run.env` node of the composed config: its keys as env.toml spells them (every key
        present), the executor's beside the neutral ones."""
        neutral = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "part"}
        return {**neutral, **dataclasses.asdict(self.part)}
