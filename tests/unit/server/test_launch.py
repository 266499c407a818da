"""The builtin deployment as a job starts it: the server command line and the health wait."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpteval.errors import ConfigError, DeploymentError
from ckpteval.server.launch import health_url, serve_command, start_local_server, wait_until_healthy
from ckpteval.server.options import ServeOptions
from tests.deploy_support import RunningServer, free_port


def test_serve_command() -> None:
    command = serve_command(
        python="/venv/bin/python",
        checkpoint="/ck/smol",
        port=8123,
        served_model_name="m",
        max_batch_size=8,
        prepare="smollm2",
    )
    assert command[:4] == ["/venv/bin/python", "-m", "ckpteval.server", "serve"]
    pairs = dict(zip(command[4::2], command[5::2], strict=True))
    assert pairs == {
        "--checkpoint": "/ck/smol",
        "--port": "8123",
        "--host": "127.0.0.1",
        "--served-model-name": "m",
        "--device": "auto",
        "--max-batch-size": "8",
        "--prepare": "smollm2",
    }


def test_serve_command_is_accepted_by_the_entry_point() -> None:
    command = serve_command(python=sys.executable, checkpoint="/ck", port=1, served_model_name="m")
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--served-model-name" in result.stdout


def test_health_url() -> None:
    assert health_url("http://h:8000") == "http://h:8000/v1/health"
    assert health_url("http://h:8000/v1/") == "http://h:8000/v1/health"


def test_waits_for_a_healthy_server(tiny_server: RunningServer) -> None:
    wait_until_healthy(tiny_server.url, timeout=10, process=tiny_server.process)
    wait_until_healthy(tiny_server.url + "/v1/health", timeout=10)


def test_a_dying_server_fails_fast_with_its_log(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    log_path.write_text("loading...\nerror: Checkpoint /x does not exist.\n")
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    started = time.monotonic()
    with pytest.raises(DeploymentError) as info:
        wait_until_healthy(f"http://127.0.0.1:{free_port()}", timeout=60, process=process, log_path=log_path)
    assert time.monotonic() - started < 10
    assert "exited with code 3" in info.value.message
    assert "Checkpoint /x does not exist" in info.value.message


def test_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(DeploymentError, match="not healthy after 1 s"):
        wait_until_healthy(f"http://127.0.0.1:{free_port()}", timeout=1)
    assert time.monotonic() - started < 5


def test_start_local_server_reports_why_it_died(tmp_path: Path) -> None:
    log_path = tmp_path / "logs" / "server.log"
    with pytest.raises(DeploymentError) as info:
        start_local_server(
            checkpoint=tmp_path / "missing", port=free_port(), log_path=log_path, served_model_name="m", timeout=120
        )
    assert "exited with code 1" in info.value.message
    assert f"Checkpoint {tmp_path / 'missing'} does not exist" in info.value.message  # the server's own words
    assert "Traceback" not in log_path.read_text()


def test_the_prefix_cache_switch_reaches_the_server_command_line(isolated_user: Path) -> None:
    from ckpteval.config.compile import compile_config
    from ckpteval.config.compose import CompileRequest
    from ckpteval.config.schema import MegatronDeployment
    from ckpteval.deploy.commands import builtin_command

    def command(*overrides: str) -> str:
        deployment = compile_config(CompileRequest(configs=("tiny",), overrides=overrides)).config.deployment
        assert isinstance(deployment, MegatronDeployment)
        return builtin_command(deployment, python="python", port=1)

    assert "--no-prefix-cache" not in command() and "--prefix-cache-mib" not in command()  # sized by the server
    assert command("deployment.prefix_cache=false").endswith(" --no-prefix-cache")
    assert command("deployment.prefix_cache_mib=3000").endswith(" --prefix-cache-mib 3000")
    assert ServeOptions.from_argv(["--checkpoint", "/ck", "--prefix-cache-mib", "3000"]).prefix_cache_mib == 3000
    with pytest.raises(ConfigError, match=r"deployment.prefix_cache_mib must be at least 1, not 0"):
        command("deployment.prefix_cache_mib=0")
    argv = serve_command(python=sys.executable, checkpoint="/ck", port=1, served_model_name="m", prefix_cache=False)
    result = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--no-prefix-cache" in result.stdout and "--prefix-cache-mib" in result.stdout


def test_a_prefix_cache_budget_below_one_mib_is_refused_before_loading(tmp_path: Path) -> None:
    argv = serve_command(
        python=sys.executable, checkpoint=str(tmp_path / "none"), port=free_port(), served_model_name="m"
    )
    result = subprocess.run([*argv, "--prefix-cache-mib", "0"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--prefix-cache-mib must be at least 1, not 0." in result.stderr and "--no-prefix-cache" in result.stderr
