"""The roles a job's deployments play, in one registry: `model` (the evaluated checkpoint, `deployment:`) and
`judge` (a judge deployed beside it, `judge=builtin`); another (a reward endpoint) is one more entry.

A role says where the config holds the deployment section it serves (`section`: None when the config deploys
nothing for it), and how the job names what belongs to it: its files in the job directory (`stem`: the
model's are the names every earlier job wrote, `state/deployment`, `logs/deployment.log`, ...; any other
role's carry its name, `state/judge`, `logs/judge.log`), the shell variable holding the port it published
(`port_var`: `DEPLOY_PORT` for the model, `JUDGE_PORT` for the judge) and its Slurm step's name. The plan
(`job.build`), the job script (`job.script`), the snapshot, `status` and `logs` iterate over the roles a
job has, in registry order; nothing else names a role.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckpteval.invocation.jobdir import JobDir

if TYPE_CHECKING:
    from ckpteval.config.schema import EvalConfig

MODEL = "model"
JUDGE = "judge"


@dataclass(frozen=True)
class Role:
    """One role a deployment plays in a job (see the module docstring)."""

    name: str
    section: Callable[[EvalConfig], Any | None]  # the config's deployment section for this role, or None
    stem: str  # its files: state/<stem>, state/<stem>_port, state/<stem>_identity, logs/<stem>.log
    var: str  # its shell variables' prefix: <var>_PORT holds the port it published
    # the task clients talk to it (the model); else it serves the clients' harnesses (a judge)
    evaluated: bool = False

    @property
    def port_var(self) -> str:
        return "DEPLOY_PORT" if self.evaluated else f"{self.var}_PORT"

    @property
    def step_name(self) -> str:
        """Its Slurm step's name (`scancel --signal` finds the step by it)."""
        return self.stem

    @property
    def state_file(self) -> str:
        return JobDir.deployment_state(self.stem)

    @property
    def port_file(self) -> str:
        return JobDir.deployment_port(self.stem)

    @property
    def identity_file(self) -> str:
        return JobDir.deployment_identity(self.stem)

    @property
    def log(self) -> str:
        return JobDir.deployment_log(self.stem)

    @property
    def served_file(self) -> str:
        """What a builtin server of this role loaded (`server.loaded`)."""
        return JobDir.served_checkpoint(self.stem)

    @property
    def label(self) -> str:
        """How status and the job's log name it."""
        return "deployment" if self.evaluated else self.name


_REGISTRY: dict[str, Role] = {}


def register_role(role: Role) -> Role:
    """Add (or replace) `role`; roles keep the order they were first registered in (the model first)."""
    if any(r.stem == role.stem and r.name != role.name for r in _REGISTRY.values()):
        raise ValueError(f"role {role.name}: its files' stem {role.stem!r} is another role's")
    _REGISTRY[role.name] = role
    return role


def unregister_role(name: str) -> None:
    """Remove a role (a test's double, when the test ends); the model's stays."""
    if name != MODEL:
        _REGISTRY.pop(name, None)


def roles() -> tuple[Role, ...]:
    """Every registered role, the model first."""
    return tuple(_REGISTRY.values())


def role(name: str) -> Role:
    return _REGISTRY[name]


def role_by_stem(stem: str) -> Role | None:
    """The role whose files carry `stem` (`deployment`: the model's), None for none."""
    return next((r for r in _REGISTRY.values() if r.stem == stem or r.name == stem), None)


def deployed_roles(config: EvalConfig) -> list[tuple[Role, Any]]:
    """(role, deployment section) of every role `config` deploys something for, the model first."""
    return [(r, section) for r in _REGISTRY.values() if (section := r.section(config)) is not None]


def _model_section(config: EvalConfig) -> Any:
    return config.deployment


def _judge_section(config: EvalConfig) -> Any | None:
    from ckpteval.config.schema import deployed_judge

    return deployed_judge(config)


register_role(Role(name=MODEL, section=_model_section, stem="deployment", var="DEPLOY", evaluated=True))
register_role(Role(name=JUDGE, section=_judge_section, stem="judge", var="JUDGE"))
