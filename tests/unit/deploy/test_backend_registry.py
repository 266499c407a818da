"""A deployment backend plugs in through the registry alone: a test double (a small HTTP health server with a
config section of its own) registered with `register_backend` from this file is a `deployment.type` a config
can name: `deployment=health-double deployment.port=...` compiles, its keys are checked like a shipped
section's, and the job plan starts it; a real job script runs it to the end: the job waits for its health,
checks the identity it reports on the port it wrote down, and runs the tasks against it."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import pytest

from ckpteval.config.compile import CompiledConfig, compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.config.schema import Endpoints
from ckpteval.deploy.backends import DeploymentBackend, Launch, LaunchContext, register_backend, unregister_backend
from ckpteval.job.build import build_plan, local_toolchain
from tests.unit.job.test_script import free_port, make_plan, run_job, state, write_job

ROUTES = Endpoints(completions="/v1/completions", chat="/v1/chat/completions", health="/v1/health")


@dataclass(frozen=True, kw_only=True)
class HealthDeployment:
    """The double's config section."""

    type: Literal["health-double"]
    port: int  # required: `deployment=health-double` alone leaves it ??? (must be set)
    served_model_name: str = "double"
    tokenizer: str | None = None
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


def _compiled(*overrides: str) -> CompiledConfig:
    return compile_config(
        CompileRequest(
            configs=("tiny",), overrides=("deployment=health-double", "deployment.tokenizer=tok", *overrides)
        )
    )


def test_a_config_names_the_registered_type_and_sets_its_own_keys(health_double: DeploymentBackend):
    compiled = _compiled("deployment.port=8123", "deployment.served_model_name=mine")
    assert compiled.config.deployment == HealthDeployment(
        type="health-double", port=8123, served_model_name="mine", tokenizer="tok"
    )
    assert compiled.config.target.api_endpoint.model_id == "mine"  # the packaged config's interpolation


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("deployment.port=eighty", "'deployment.port' must be an integer, not 'eighty'"),
        ("deployment.prot=80", "Did you mean deployment.port=80?"),
        ("+deployment.prot=80", "unknown key 'deployment.prot'. Did you mean 'port'?"),
        ("+deployment.prepare=tiny", "deployment.prepare belongs to deployment type megatron"),
        (
            "deployment.type=health-dubble",
            "'health-dubble'; it must be one of 'megatron', 'vllm', 'sglang', 'generic', 'none', "
            "'health-double'. Did you mean 'health-double'?",
        ),
        ("deployment.type=[a,b]", "'deployment.type' is ['a', 'b']; it must be one of"),
    ],
)
def test_its_keys_are_checked_like_a_shipped_sections(health_double: DeploymentBackend, override: str, message: str):
    from ckpteval.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        _compiled("deployment.port=8123", override)
    assert message in f"{refused.value.message} {refused.value.hint}"


def test_a_required_key_left_unset_is_named(health_double: DeploymentBackend):
    from ckpteval.errors import ConfigError

    with pytest.raises(ConfigError, match=r"'deployment\.port' is required"):
        _compiled()


def test_the_job_starts_what_the_registered_backend_launches(health_double: DeploymentBackend, tmp_path: Path):
    port = free_port()
    job_dir = tmp_path / "job"
    compiled = _compiled(f"deployment.port={port}", f"+deployment.env_vars.HITS={job_dir / 'hits.log'}")
    built = build_plan(
        compiled,
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


def test_unregistered_its_type_is_refused_again(tmp_path: Path):
    from ckpteval.errors import ConfigError

    register_backend(DeploymentBackend("health-double", HealthDeployment, _launch))
    _compiled("deployment.port=8123")
    unregister_backend("health-double")
    with pytest.raises(ConfigError, match=r"'deployment\.type' is 'health-double'; it must be one of 'megatron'"):
        _compiled("deployment.port=8123")


def test_a_kind_with_no_backend_is_one_clear_error(tmp_path: Path):
    from ckpteval.errors import ConfigError

    compiled = _compiled_without_backend(HealthDeployment(type="health-double", port=free_port()))
    with pytest.raises(ConfigError, match="No deployment backend is registered for 'health-double'"):
        build_plan(
            compiled,
            invocation="8a8b8c8d",
            job_dir=str(tmp_path),
            toolchain=local_toolchain(),
            launcher="processes",
        )


def _compiled_without_backend(deployment: HealthDeployment) -> CompiledConfig:
    """A compiled config holding a section whose backend was never registered (a config saved while it was)."""
    compiled = compile_config(CompileRequest(configs=("tiny",)))
    return replace(compiled, config=replace(compiled.config, deployment=deployment))
