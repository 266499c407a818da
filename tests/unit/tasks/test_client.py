"""The task client command line and environment, run through a real bash."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from ckpteval.tasks.client import client_command, client_env, hook_dir

FAKE = """#!/usr/bin/env python3
import json, os, shutil, sys
print(json.dumps({"argv": sys.argv[1:], "pythonpath": os.environ.get("PYTHONPATH"),
                  "lm_eval": shutil.which("lm-eval"), "adapter_port": os.environ.get("ADAPTER_PORT")}))
"""


@pytest.fixture
def fake_env(tmp_path: Path) -> Path:
    """A directory standing for an environment: `nemo-evaluator` and the harness's `lm-eval` side by side."""
    bindir = tmp_path / "env with space" / "bin"
    bindir.mkdir(parents=True)
    for name in ("nemo-evaluator", "lm-eval"):
        (bindir / name).write_text(FAKE)
        (bindir / name).chmod(stat.S_IRWXU)
    return bindir


def run(command: str, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=30, check=True)
    return dict(json.loads(done.stdout))


def test_command_passes_the_run_config_path_verbatim(fake_env: Path) -> None:
    config = "/jobs/x y/tasks/it's/run_config.yml"
    command = client_command(config, executable=str(fake_env / "nemo-evaluator"))
    seen = run(command, {"PATH": "/usr/bin:/bin"})
    assert seen["argv"] == ["run_eval", "--run_config", config]
    # nemo-evaluator starts `lm-eval` by name: the environment it lives in comes first on PATH
    assert seen["lm_eval"] == str(fake_env / "lm-eval")


def test_hook_dir_is_prepended_to_the_existing_pythonpath(fake_env: Path) -> None:
    command = client_command("/r.yml", executable=str(fake_env / "nemo-evaluator"), hook_dir="/hooks/a b")
    assert (
        run(command, {"PATH": "/usr/bin:/bin", "PYTHONPATH": "/image/site"})["pythonpath"] == "/hooks/a b:/image/site"
    )
    assert run(command, {"PATH": "/usr/bin:/bin"})["pythonpath"] == "/hooks/a b"


def test_each_client_gets_its_own_proxy_port(fake_env: Path) -> None:
    command = client_command("/r.yml", executable=str(fake_env / "nemo-evaluator"))
    ports = {run(command, {"PATH": "/usr/bin:/bin"})["adapter_port"] for _ in range(5)}
    assert len(ports) == 5 and all(1024 < int(str(p)) < 65536 for p in ports)
    # an explicit choice is respected
    assert run(command, {"PATH": "/usr/bin:/bin", "ADAPTER_PORT": "4000"})["adapter_port"] == "4000"


def test_bare_executable_is_looked_up_on_path(fake_env: Path) -> None:
    command = client_command("/r.yml")
    assert command.endswith(" nemo-evaluator run_eval --run_config /r.yml")
    assert run(command, {"PATH": f"{fake_env}:/usr/bin:/bin"})["argv"] == ["run_eval", "--run_config", "/r.yml"]


def test_hook_dir_holds_only_the_hook_modules() -> None:
    names = {p.name for p in Path(hook_dir()).glob("*.py")}
    # everything on the harness's PYTHONPATH shadows same-named modules: keep it to our prefixed names
    assert names == {
        "__init__.py",
        "sitecustomize.py",
        "ckpteval_hook.py",
        "ckpteval_offline_data.py",
        "ckpteval_code_eval.py",
        "ckpteval_sandbox.py",
        "ckpteval_request_timeout.py",
        "ckpteval_wait_ready.py",
        "ckpteval_responses.py",
        "ckpteval_request_order.py",
        "ckpteval_request_turn.py",
        "ckpteval_settings_probe.py",
        "ckpteval_dataset_ids.py",
        "ckpteval_judge.py",
        "ckpteval_documents.py",
    }
    assert os.path.isabs(hook_dir())


def test_client_env() -> None:
    env = client_env(offline_data="auto")
    assert env == {
        "CKPTEVAL_OFFLINE_DATA": "auto",
        "HF_ALLOW_CODE_EVAL": "1",
        "NEMO_EVALUATOR_LOG_LEVEL": "WARNING",
        "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0",
    }
    env = client_env(offline_data="on", dataset_dir="/data sets", telemetry=True, log_level="INFO")
    assert env["CKPTEVAL_DATASET_DIR"] == "/data sets" and "NEMO_EVALUATOR_TELEMETRY_LEVEL" not in env
    with pytest.raises(ValueError, match="auto, on or off"):
        client_env(offline_data="maybe")  # type: ignore[arg-type]
