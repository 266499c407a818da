"""The pre-submission check that the profile's Python can import ckpteval, run through the real LocalRemote
(a login node reached with tunnel="local") against real interpreters: this venv's and one without ckpteval."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpteval.cluster.preflight import check_builtin_python, forget_answers, needs_cluster_python
from ckpteval.cluster.remote import LocalRemote, RunResult
from ckpteval.config.profiles import Profile, make_profile
from ckpteval.errors import ConfigError
from ckpteval.job.plan import DeploymentPlan, JobPlan, Step

WITHOUT_CKPTEVAL = "/usr/bin/python3"  # the system interpreter: ckpteval lives only in the project's venv


class CountingRemote(LocalRemote):
    """This machine, counting the commands it is asked to run."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[object] = []

    def run(self, argv, **kwargs) -> RunResult:  # type: ignore[override]
        self.commands.append(argv)
        return super().run(argv, **kwargs)


def plan(kind: str = "megatron/builtin", image: str | None = None) -> JobPlan:
    step = Step(command="exec python -m ckpteval.server serve", image=image)
    deployment = DeploymentPlan(kind=kind, step=step, health_url=None, readiness_timeout=60)
    return JobPlan(invocation="inv", job_dir="/j", deployment=deployment, tasks=())


def profile(python: str) -> Profile:
    return make_profile(name="C", tunnel="local", remote_job_dir="/j", python=python)


@pytest.fixture(autouse=True)
def fresh_answers() -> Iterator[None]:
    forget_answers()
    yield
    forget_answers()


def test_a_python_that_imports_ckpteval_passes_and_is_asked_once():
    remote = CountingRemote()
    check_builtin_python(remote, plan(), profile(sys.executable))
    check_builtin_python(remote, plan(), profile(sys.executable))  # the same invocation: no second trip
    assert remote.commands == [[sys.executable, "-c", "import ckpteval, sys; sys.stdout.write(ckpteval.__file__)"]]


@pytest.mark.skipif(not Path(WITHOUT_CKPTEVAL).exists(), reason="needs the system python3")
def test_a_python_without_ckpteval_is_refused_before_submission_with_the_fix():
    remote = CountingRemote()
    with pytest.raises(ConfigError) as err:
        check_builtin_python(remote, plan(), profile(WITHOUT_CKPTEVAL))
    assert err.value.message == (
        f"Profile [C]: python = {WITHOUT_CKPTEVAL} cannot import ckpteval on this machine "
        "(ModuleNotFoundError: No module named 'ckpteval'), and the job runs ckpteval with it (the builtin "
        "deployment, or the export step of vLLM/SGLang)."
    )
    assert 'python = "/path/to/venv/bin/python"' in (err.value.hint or "")
    with pytest.raises(ConfigError):
        check_builtin_python(remote, plan(), profile(WITHOUT_CKPTEVAL))
    assert len(remote.commands) == 1  # the failed answer is kept too


def test_a_python_that_does_not_exist_says_so():
    with pytest.raises(ConfigError, match=r"python = /no/such/python cannot import ckpteval on this machine \("):
        check_builtin_python(LocalRemote(), plan(), profile("/no/such/python"))


@pytest.mark.parametrize(
    ("kind", "image"),
    [
        ("megatron/builtin", "nvcr.io/nvidia/nemo:25.09"),  # runs inside an image: the login node's Python is moot
        ("megatron/export-deploy", "nvcr.io/nvidia/nemo:25.09"),
        ("vllm", "vllm/vllm-openai:v0.10.0"),
        ("generic", None),
    ],
)
def test_other_deployments_ask_nothing(kind, image):
    remote = CountingRemote()
    assert not needs_cluster_python(plan(kind, image))
    check_builtin_python(remote, plan(kind, image), profile("/no/such/python"))
    assert remote.commands == []


def test_no_deployment_asks_nothing():
    none = JobPlan(
        invocation="inv",
        job_dir="/j",
        deployment=DeploymentPlan(kind="none", step=None, health_url=None, readiness_timeout=1),
        tasks=(),
    )
    remote = CountingRemote()
    check_builtin_python(remote, none, profile("/no/such/python"))
    assert remote.commands == []
