"""Fixtures for tests against the real test cluster (Slurm + sshd) that tests/infra/setup.sh brings up.

`infra` checks that it is up (sshd answers, Slurm answers, infra.json exists); run as root with
it down, it runs the setup script (~50 s on a fresh machine, ~8 s otherwise), with it up, the
script's `project` step (the CI user must be able to run this venv's python, whichever Python 3.11
uv linked it to). Without root and without the cluster, the tests fail and say how to bring it up.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckpteval.config.profiles import toml_value

REPO = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = REPO / "tests" / "infra" / "setup.sh"
INFRA_DIR = Path(os.environ.get("CI_INFRA_DIR", "/tmp/ci-infra"))


@dataclass(frozen=True)
class Infra:
    """What infra.json says about the running test cluster."""

    infra_dir: Path
    ssh_host: str
    ssh_port: int
    ssh_user: str
    ssh_key: str
    ssh_known_hosts: str
    ssh_config: str
    ssh_alias: str
    ssh_alias_proxyjump: str
    ssh_log: str
    user_home: str
    slurm_account: str
    slurm_partition: str
    slurm_nodes: int
    gpus_per_node: int
    enroot_bin_dir: str
    enroot_log: str

    def enroot_calls(self, needle: str, command: str = "import") -> list[list[str]]:
        """The fake enroot's call-log lines for `command` whose arguments contain `needle`.

        Each line: [epoch, user, pid, slurm job id, CUDA_VISIBLE_DEVICES, arguments].
        """
        calls = []
        for line in Path(self.enroot_log).read_text().splitlines():
            fields = line.split("\t")
            if len(fields) == 6 and fields[5].startswith(command) and needle in fields[5]:
                calls.append(fields)
        return calls


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the cluster is marked `slurm`, so `-m "not slurm"` runs all the others."""
    for item in items:
        if "infra" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)


def _is_up(info_path: Path) -> bool:
    if not info_path.is_file():
        return False
    info = json.loads(info_path.read_text())
    try:
        with socket.create_connection((info["ssh_host"], info["ssh_port"]), timeout=2) as sock:
            if not sock.recv(64).startswith(b"SSH-"):
                return False
    except OSError:
        return False
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30, check=False)
    return ping.returncode == 0 and "UP" in ping.stdout


def _run_setup(request: pytest.FixtureRequest, *args: str) -> None:
    """Run the setup script (as root); show the permission changes it made, fail with its output."""
    done = subprocess.run(
        ["bash", str(SETUP_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "CI_INFRA_DIR": str(INFRA_DIR), "PROJECT_DIR": str(REPO)},
    )
    if done.returncode != 0:
        pytest.fail(f"{SETUP_SCRIPT} {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    changes = [line for line in done.stdout.splitlines() if " traversable by others " in line]
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if changes and reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # past the output capture, as pytest's own lines
            reporter.write_line("")
            for line in changes:
                reporter.write_line(line)


@pytest.fixture(scope="session")
def infra(request: pytest.FixtureRequest) -> Infra:
    """The running test cluster; brought up here if it is down and we are root.

    As root, it also makes this project's venv python runnable by the CI user (Slurm jobs run it),
    whichever Python 3.11 uv linked it to, also when the venv was created after the cluster came up.
    """
    info_path = INFRA_DIR / "infra.json"
    if not (shutil.which("scontrol") and _is_up(info_path)):
        if os.geteuid() != 0:
            pytest.fail(f"The test cluster is not running. Bring it up with: sudo bash {SETUP_SCRIPT}")
        _run_setup(request)
    elif os.geteuid() == 0:
        _run_setup(request, "project")  # ~0.1 s when nothing is to change
    compile_for_the_ci_user()
    data = json.loads(info_path.read_text())
    data["infra_dir"] = Path(data["infra_dir"])
    return Infra(**data)


def compile_for_the_ci_user() -> None:
    """Write the .pyc of every module of this venv and of the project (a few seconds when they are there:
    `.ci/run` syncs with --compile-bytecode; ~130 s of CPU once when they are not).

    The cluster's jobs run this venv's python as the CI user, who cannot write .pyc files into it, so without
    them every job's Python process compiles all it imports again: torch, the harness, Ray. Ray's raylet gives
    its dashboard agent 15 s (hard-coded in Ray 2.55) to start and write its port file, or aborts: uncompiled,
    the agent's imports alone took 21-22 s at load average 9, compiled 7 s (benchmarks/ci_time.md)."""
    import compileall
    import sysconfig

    for tree in (sysconfig.get_paths()["purelib"], str(REPO / "src")):
        compileall.compile_dir(tree, quiet=2, workers=0)


@pytest.fixture(scope="session")
def tiny_checkpoint(infra: Infra) -> Iterator[str]:
    """The tiny Megatron checkpoint, written once per session where the CI user's jobs (and this machine) can
    read it: the modules that evaluate it on the cluster share it (writing it costs a megatron import)."""
    from ckpteval.server.prepare import prepare_checkpoint

    tests_dir = Path(infra.user_home) / "ckpteval-tests"
    # the CI user's jobs make their own directories in it: if this (root) creates it first, it is the CI user's
    tests_dir.mkdir(exist_ok=True)
    shutil.chown(tests_dir, user=infra.ssh_user)
    path = tests_dir / f"tiny-{uuid.uuid4().hex[:8]}"
    prepare_checkpoint("tiny", path)
    subprocess.run(["chmod", "-R", "a+rX", str(path.parent)], check=True)
    yield str(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def remote_job_dir(infra: Infra) -> Iterator[str]:
    """A fresh, not yet existing directory under the CI user's home; removed afterwards."""
    path = f"{infra.user_home}/ckpteval-tests/{uuid.uuid4().hex[:12]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)  # same machine, and we are root


@pytest.fixture
def ci_profile_values(infra: Infra, remote_job_dir: str) -> dict[str, Any]:
    """env.toml profile keys that reach the test cluster over SSH as the CI user."""
    return {
        "executor": "slurm",
        "tunnel": "ssh",
        "host": infra.ssh_host,
        "port": infra.ssh_port,
        "user": infra.ssh_user,
        "identity": infra.ssh_key,
        "account": infra.slurm_account,
        "partition": infra.slurm_partition,
        "time": "00:10:00",
        "remote_job_dir": remote_job_dir,
    }


@pytest.fixture
def write_env_toml(tmp_path: Path, ci_profile_values: dict[str, Any]) -> Callable[..., Path]:
    """Write an env.toml with one profile (the CI cluster's values, then `overrides`) and return its path.

    `overrides` may set a key to None to leave it out.
    """

    def write(name: str = "CI", **overrides: Any) -> Path:
        values = {**ci_profile_values, **overrides}
        lines = [f"[{name}]"] + [f"{k} = {toml_value(v)}" for k, v in values.items() if v is not None]
        path = tmp_path / f"env-{uuid.uuid4().hex[:6]}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    return write


@pytest.fixture
def ci_profile(write_env_toml: Callable[..., Path]) -> Callable[..., Any]:
    """Build a Profile for the CI cluster through a real env.toml (overrides as in write_env_toml)."""
    from ckpteval.config.profiles import load_env_file

    def make(**overrides: Any) -> Any:
        return load_env_file(write_env_toml("CI", **overrides)).profile("CI")

    return make


@pytest.fixture
def ssh_home(tmp_path: Path, infra: Infra, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated $HOME with an empty ~/.ssh (no keys, no config, no known_hosts) and no agent."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def trust_infra_host(home: Path, infra: Infra) -> None:
    """Give an isolated home the test sshd's host key (as `ssh-keyscan >> known_hosts` would)."""
    shutil.copy(infra.ssh_known_hosts, home / ".ssh" / "known_hosts")
