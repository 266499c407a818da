"""Run one task the way a ckpteval job does, and endpoints that misbehave on purpose."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckpteval.tasks.catalog import load_catalog
from ckpteval.tasks.client import client_command, client_env, hook_dir
from ckpteval.tasks.runconfig import EndpointSpec, TaskPaths, build_run_config, client_hook_env, write_run_config
from tests.e2e.conftest import free_port

FAKE_ENDPOINT = Path(__file__).with_name("fake_endpoint.py")
NEMO_EVALUATOR = str(Path(sys.executable).parent / "nemo-evaluator")


@dataclass(frozen=True)
class TaskRun:
    """A finished client run: its exit status, where its files are, how long it took."""

    returncode: int
    paths: TaskPaths
    seconds: float


def start_task(
    task: str,
    task_dir: Path,
    *,
    url: str,
    params: dict[str, Any],
    model_id: str = "megatron-model",
    offline_data: str = "auto",
    adapter_config: dict[str, Any] | None = None,
    hook: bool = True,
    health: str | None = None,
) -> subprocess.Popen[bytes]:
    """Write the run config and start the client exactly as the job script does (bash, env, log).

    `hook=False` leaves out the variables that switch on the harness hook's response cache and progress
    (for benchmarks that measure lm-eval alone). `health`: the deployment's /v1/health URL, which the job
    gives its clients: the hook replays a cached answer only when it reports the content that gave it."""
    paths = TaskPaths(task_dir)
    spec = load_catalog().get(task)
    endpoint = EndpointSpec(url=url, model_id=model_id, type="completions")
    user: dict[str, Any] = {"config": {"params": params}}
    if adapter_config is not None:
        user["target"] = {"api_endpoint": {"adapter_config": adapter_config}}
    run_config = build_run_config(spec, user, endpoint=endpoint, output_dir=str(paths.output_dir))
    write_run_config(run_config, paths.run_config)
    command = client_command(str(paths.run_config), executable=NEMO_EVALUATOR, hook_dir=hook_dir())
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CKPTEVAL_")},
        **client_env(offline_data=offline_data),  # type: ignore[arg-type]
        **(client_hook_env(run_config) if hook else {}),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        **({"CKPTEVAL_DEPLOYMENT_HEALTH": health} if health else {}),
    }
    with open(paths.log, "ab") as log:
        return subprocess.Popen(["bash", "-c", command], env=env, stdout=log, stderr=subprocess.STDOUT)


def run_task(task: str, task_dir: Path, **kwargs: Any) -> TaskRun:
    """`start_task` and wait (at most 15 minutes)."""
    start = time.monotonic()
    proc = start_task(task, task_dir, **kwargs)
    returncode = proc.wait(timeout=900)
    return TaskRun(returncode, TaskPaths(task_dir), time.monotonic() - start)


@dataclass(frozen=True)
class FakeEndpoint:
    """A running fake_endpoint.py: its completions URL and what it received."""

    url: str
    count_file: Path

    def received(self) -> list[tuple[float, str, str]]:
        """(arrival time, prompt digest, prompt start) per completions request received."""
        if not self.count_file.exists():
            return []
        out = []
        for line in self.count_file.read_text().splitlines():
            stamp, digest, start = line.split(" ", 2)
            out.append((float(stamp), digest, start))
        return out


@pytest.fixture
def fake_endpoint(tmp_path: Path) -> Iterator[Callable[..., FakeEndpoint]]:
    """`fake_endpoint(*args, port=None)` starts fake_endpoint.py with `args` (see its docstring) on `port`
    (default: a free one)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str, port: int | None = None) -> FakeEndpoint:
        port = port or free_port()
        count = tmp_path / f"received-{port}.txt"
        argv = [sys.executable, str(FAKE_ENDPOINT), "--port", str(port), "--count-file", str(count), *args]
        procs.append(subprocess.Popen(argv, start_new_session=True))
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            with contextlib.suppress(OSError):
                urllib.request.urlopen(base + "/v1/health", timeout=1).close()
                return FakeEndpoint(base + "/v1/completions", count)
            time.sleep(0.1)
        raise RuntimeError("fake endpoint did not start")

    yield start
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
