"""A deployment backend plugs in through the registry alone: a test double (a small HTTP health server with a
config section of its own) registered with `register_backend` is what the job plan starts, and a real job
script runs it to the end: the job waits for its health, checks the identity it reports on the port it wrote
down, and runs the tasks against it."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import pytest

from ckpteval.config.compose import CompileRequest
from ckpteval.config.schema import Endpoints
from ckpteval.deploy.backends import DeploymentBackend, Launch, LaunchContext, register_backend, unregister_backend
from ckpteval.job.build import build_plan, local_toolchain
from tests.unit.job.test_script import free_port, make_plan, run_job, state, write_job

ROUTES = Endpoints(completions="/v1/completions", chat="/v1/chat/completions", health="/v1/health")


@dataclass(frozen=True, kw_only=True)
class HealthDeployment:
    """The double's config section."""

    type: Literal["health-double"] = "health-double"
    port: int
    served_model_name: str = "double"
    env_vars: dict[str, str] = field(default_factory=dict)
    endpoints: Endpoints = ROUTES


def _launch(deployment: HealthDeployment, context: LaunchContext) -> Launch:
    """The health server of tests/unit/job/test_script.py, reporting the job's identity, writing its port."""
    reports = f"env REPORTS={shlex.quote(context.identity or '')} "
    port_file = f" {shlex.quote(context.port_file)}" if context.port_file else ""
    return Launch(command=f"exec {reports}{sys.executable} server.py {context.port}{port_file}", mounted=False)


@pytest.fixture
def health_double() -> Iterator[DeploymentBackend]:
    backend = register_backend(
        DeploymentBackend("health-double", HealthDeployment, _launch, identity_route="health", holds_port=True)
    )
    yield backend
    unregister_backend("health-double")


def _compiled(deployment: HealthDeployment):  # type: ignore[no-untyped-def]
    from ckpteval.config.compile import compile_config

    compiled = compile_config(CompileRequest(configs=("tiny",)))
    return replace(compiled, config=replace(compiled.config, deployment=deployment))


def test_the_job_starts_what_the_registered_backend_launches(health_double: DeploymentBackend, tmp_path: Path):
    port = free_port()
    job_dir = tmp_path / "job"
    deployment = HealthDeployment(port=port, env_vars={"HITS": str(job_dir / "hits.log")})
    built = build_plan(
        _compiled(deployment),
        invocation="7a7b7c7d",
        job_dir=str(job_dir),
        toolchain=local_toolchain(),
        launcher="processes",
    )
    dep = built.deployment
    assert dep.kind == "health-double" and dep.step is not None
    assert dep.identity is not None and dep.identity.startswith("7a7b7c7d-")  # it reports one: the job made it
    assert dep.identity_url == f"http://127.0.0.1:{port}/v1/health"
    assert dep.port_file == str(job_dir / "state" / "deployment_port")
    assert dep.step.command.endswith(f"server.py {port} {dep.port_file}")

    # the registry's deployment plan in a real job, with tasks that wait for it as the harness hook does
    plan = replace(make_plan(job_dir, port=port, tasks=[("t1", f"echo scored > {job_dir}/scored.txt")]), deployment=dep)
    result = run_job(write_job(tmp_path, plan))
    assert result.returncode == 0, result.stdout + result.stderr
    assert state(job_dir, "state/deployment_port") == str(port)
    assert (job_dir / "scored.txt").read_text() == "scored\n"
    assert "/v1/health" in (job_dir / "hits.log").read_text()


def test_a_kind_with_no_backend_is_one_clear_error(tmp_path: Path):
    from ckpteval.errors import ConfigError

    deployment = HealthDeployment(port=free_port())  # its backend not registered
    with pytest.raises(ConfigError, match="No deployment backend is registered for 'health-double'"):
        build_plan(
            _compiled(deployment),
            invocation="8a8b8c8d",
            job_dir=str(tmp_path),
            toolchain=local_toolchain(),
            launcher="processes",
        )
