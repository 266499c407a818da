"""`evaluate deploy` and `evaluate prepare` as a user runs them: clear messages, exit codes, clean stop."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ckpteval.errors import DeploymentError
from ckpteval.server.checkpoint import load_checkpoint_info
from ckpteval.server.launch import wait_until_healthy
from tests.deploy_support import free_port, request_json

EVALUATE = str(Path(sys.executable).parent / "evaluate")


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([EVALUATE, *args], capture_output=True, text=True, timeout=timeout, env=env)


def assert_clean_failure(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in result.stderr


def test_port_in_use(tiny_checkpoint: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("deploy", "--checkpoint", str(tiny_checkpoint), "--port", str(port), timeout=60)
    assert_clean_failure(result, f"Port {port} on 127.0.0.1 is already in use", "--port")


def test_replicas_bad_count_and_port_in_use(tiny_checkpoint: Path) -> None:
    result = run("deploy", "--checkpoint", str(tiny_checkpoint), "--replicas", "0", timeout=60)
    assert_clean_failure(result, "--replicas must be at least 1")
    with socket.socket() as taken:  # the router binds the port before starting any replica
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("deploy", "--checkpoint", str(tiny_checkpoint), "--port", str(port), "--replicas", "2")
    assert_clean_failure(result, f"Port {port} on 127.0.0.1 is already in use")


def test_checkpoint_that_does_not_exist(tmp_path: Path) -> None:
    result = run("deploy", "--checkpoint", str(tmp_path / "nope"), "--port", str(free_port()))
    assert_clean_failure(result, "does not exist", "evaluate prepare")


def test_checkpoint_that_does_not_match_its_config(tiny_checkpoint: Path, tmp_path: Path) -> None:
    import torch

    from ckpteval.server.checkpoint import read_common_state

    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    common = read_common_state(broken / "iter_0000000")
    common["args"].hidden_size = 96  # the weights were saved with 64
    torch.save(common, broken / "iter_0000000" / "common.pt")
    result = run("deploy", "--checkpoint", str(broken), "--port", str(free_port()))
    assert_clean_failure(result, "do not match the architecture in its args", "checkpoint [", "config [")


def test_checkpoint_without_args_or_tokenizer(tiny_checkpoint: Path, tmp_path: Path) -> None:
    import torch

    from ckpteval.server.checkpoint import read_common_state

    no_tokenizer = tmp_path / "no-tok"
    shutil.copytree(tiny_checkpoint, no_tokenizer)
    shutil.rmtree(no_tokenizer / "tokenizer")
    with pytest.raises(DeploymentError, match="has no tokenizer") as info:
        load_checkpoint_info(no_tokenizer)
    assert info.value.hint and "--tokenizer" in info.value.hint
    assert load_checkpoint_info(no_tokenizer, tokenizer=tiny_checkpoint / "tokenizer").tokenizer_dir.name == "tokenizer"

    no_args = tmp_path / "no-args"
    shutil.copytree(tiny_checkpoint, no_args)
    common = read_common_state(no_args / "iter_0000000")
    del common["args"]
    torch.save(common, no_args / "iter_0000000" / "common.pt")
    with pytest.raises(DeploymentError, match="has no 'args'"):
        load_checkpoint_info(no_args)


def test_ctrl_c_stops_the_server_cleanly(tiny_checkpoint: Path, tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "deploy.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                EVALUATE,
                "deploy",
                "--checkpoint",
                str(tiny_checkpoint),
                "--port",
                str(port),
                "--served-model-name",
                "tiny",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", timeout=300, process=process, log_path=log_path)
        status, payload = request_json(
            "POST", f"http://127.0.0.1:{port}/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2}
        )
        assert status == 200 and payload["model"] == "tiny"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    output = log_path.read_text()
    assert "Serving 'tiny'" in output and "Server stopped." in output
    assert "Traceback" not in output
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):  # nothing listens any more
        probe.connect(("127.0.0.1", port))


def test_prepare_unknown_model() -> None:
    result = run("prepare", "llama", timeout=60)
    assert_clean_failure(result, "Unknown packaged model 'llama'", "smollm2, tiny")


def test_prepare_prints_the_cached_checkpoint(tiny_checkpoint: Path) -> None:
    result = run("prepare", "tiny", "--output", str(tiny_checkpoint), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tiny_checkpoint)


def test_cli_start_up_imports_nothing_heavy() -> None:
    code = (
        "import sys, ckpteval.cli.main, ckpteval.cli.deploy, ckpteval.cli.prepare, ckpteval.server;"
        "heavy = [m for m in ('torch', 'megatron', 'transformers', 'uvicorn', 'lm_eval') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == ""
    help_result = run("deploy", "--help", timeout=60)
    assert help_result.returncode == 0 and "--served-model-name" in help_result.stdout
