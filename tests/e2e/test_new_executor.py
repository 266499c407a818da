"""A new executor plugs in through the registry alone and runs an evaluation end to end.

`SubdirBackend` is a second backend for this machine: it keeps its jobs in `<output_dir>/subdir-jobs/`
and notes each job it is handed. It is one class here and one `register_executor`; nothing in ckpteval
is edited for it. An env.toml profile names it (`executor = "subdir"`), and `ckpteval.run` takes the
invocation through the one pipeline (checkpoint check, staging, render, record) to it; `status` and
`results` find it again by the executor its record names. The model is the tiny packaged one behind the
session's shared builtin server, on three zero-shot GSM8K problems (3 min at load 25 on 2 cores, most of
it the shared server's start when this test is the first to ask for it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckpteval.config.compile import CompiledConfig
from ckpteval.config.executors import Executor, register_executor, unregister_executor
from ckpteval.execution.events import Reporter
from ckpteval.execution.local import LocalBackend, LocalHost, LocalJob
from ckpteval.execution.planned import PlannedJob
from ckpteval.invocation.record import InvocationRecord
from tests.e2e.conftest import ServedModel

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


class SubdirHost(LocalHost):
    """This machine, noting each job it starts."""

    started: list[str] = []  # noqa: RUF012 (one list for the test to read)

    def start(self, record: InvocationRecord, files: dict[str, str], report: Reporter) -> LocalJob:
        SubdirHost.started.append(record.id)
        return super().start(record, files, report)


class SubdirBackend(LocalBackend):
    """Jobs on this machine, in a subdirectory of the output dir."""

    executor = "subdir"

    def job_dir(self, compiled: CompiledConfig, invocation: str) -> str:
        return str(Path(super().job_dir(compiled, invocation)).parent / "subdir-jobs" / invocation)

    def connect(self, job: PlannedJob, report: Reporter | None = None) -> SubdirHost:
        return SubdirHost()


@pytest.fixture
def subdir_executor() -> Iterator[str]:
    register_executor(
        Executor(
            name="subdir",
            backend=f"{__name__}:SubdirBackend",
            config_group="local",
            launcher="processes",
            on_cluster=False,
            watch_max_pending=1,
            watch_follow_every=5.0,
        )
    )
    yield "subdir"
    unregister_executor("subdir")


def test_an_executor_registered_here_runs_an_evaluation(
    subdir_executor: str,
    served_model: Callable[[str], ServedModel],
    isolated_user: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ckpteval
    from ckpteval.api import make_request

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    env_file = isolated_user / "env.toml"
    env_file.write_text(f'[here]\nexecutor = "{subdir_executor}"\n')
    model = served_model("tiny")
    request = make_request(
        ["tiny"],
        profile="here",
        tasks=["gsm8k"],
        env_file=env_file,
        cwd=isolated_user,
        overrides=model.gsm8k_overrides(),
    )

    outcome = ckpteval.run(request)

    assert outcome.state == "succeeded", outcome.log_tail
    assert set(outcome.scores) == {"gsm8k"}
    assert SubdirHost.started == [outcome.invocation]
    record = ckpteval.status(outcome.invocation).record
    assert record.executor == "subdir"
    job_dir = Path(record.job_dir)
    assert job_dir == (isolated_user / "results" / "subdir-jobs" / outcome.invocation).resolve()
    assert (job_dir / "results.json").is_file()
    assert ckpteval.status(outcome.invocation).state == "succeeded"
    assert ckpteval.results(outcome.invocation).tasks["gsm8k"].status == "succeeded"


def test_a_profile_naming_an_unregistered_executor_is_refused(isolated_user: Path) -> None:
    import ckpteval
    from ckpteval.errors import ConfigError

    env_file = isolated_user / "env.toml"
    env_file.write_text('[here]\nexecutor = "subdir"\n')
    with pytest.raises(ConfigError, match="'executor' is 'subdir'; it must be one of 'local', 'slurm'"):
        ckpteval.compile_config(configs=["tiny"], profile="here", env_file=env_file, cwd=isolated_user)
