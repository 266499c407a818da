"""The command a job runs for one task, and the environment it runs in.

The command is exactly what nemo-evaluator-launcher's Slurm executor runs inside the eval-factory
container (`nemo-evaluator run_eval --run_config FILE`), here or in the container, so a local score and a
cluster score come from the same harness invocation. Offline data is added from the outside: a hook
directory put first on PYTHONPATH (see `ckpteval.tasks.harness_hook`), nothing in the run config changes.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Literal

OfflineMode = Literal["auto", "on", "off"]

HOOK_DIR = Path(__file__).resolve().parent / "harness_hook"
_FREE_PORT = "python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])'"


def hook_dir() -> str:
    """The directory to put first on the task client's PYTHONPATH (holds only our `sitecustomize`)."""
    return str(HOOK_DIR)


def client_command(
    run_config_path: str,
    *,
    executable: str = "nemo-evaluator",
    hook_dir: str | None = None,
    model_url: str | None = None,
    overrides: dict[str, str] | None = None,
) -> str:
    """The bash command line that runs one task, every argument quoted.

    nemo-evaluator runs the harness's own CLI (`lm-eval`) by name, so when `executable` is a path, its
    directory (the environment both are installed in) is put first on PATH. With `hook_dir`, that is
    prepended to PYTHONPATH at run time (keeping whatever the environment or the container image already
    has there), so the harness's processes load the offline-data hook.

    The interceptor proxy's port is chosen by the kernel at run time (`ADAPTER_PORT`). nemo-evaluator 0.2.8
    scans upward from 3825 and starts the proxy seconds after finding a port free, so two task clients
    starting together on one host (two jobs on a shared node) can pick the same port; the second proxy
    then fails to bind while its harness talks to the first one: requests go to the other job's endpoint
    and land in the other job's cache. Kernel-assigned ephemeral ports do not collide that way. An
    ADAPTER_PORT already set in the environment is kept.

    `model_url` replaces the run config's endpoint URL (`--model_url`); it is a double-quoted shell word, so
    it may name the port the deployment published at run time (`${DEPLOY_PORT}`), and must hold nothing else
    the shell would expand. `overrides` (dotted run-config key -> value, `--overrides`) are double-quoted
    the same way (the judge's URL on the port the model published, when the model judges itself).
    """
    prefix = [f'ADAPTER_PORT="${{ADAPTER_PORT:-$({_FREE_PORT})}}"']
    if "/" in executable:
        prefix.append(f'PATH={shlex.quote(os.path.dirname(executable))}":$PATH"')
    if hook_dir:
        prefix.append(f'PYTHONPATH={shlex.quote(hook_dir)}"${{PYTHONPATH:+:$PYTHONPATH}}"')
    command = f"{shlex.quote(executable)} run_eval --run_config {shlex.quote(run_config_path)}"
    if model_url is not None:
        if any(c in model_url for c in '"`\\') or "$(" in model_url:
            raise ValueError(f"model_url {model_url!r} is not a plain URL")
        command += f' --model_url "{model_url}"'
    if overrides:
        words = ",".join(f"{k}={v}" for k, v in sorted(overrides.items()))
        if any(c in words for c in '"`\\') or "$(" in words:
            raise ValueError(f"overrides {words!r} are not plain values")
        command += f' --overrides "{words}"'
    return " ".join([*prefix, command])


def client_env(
    *,
    offline_data: OfflineMode,
    dataset_dir: str | None = None,
    log_level: str = "WARNING",
    telemetry: bool = False,
) -> dict[str, str]:
    """Environment variables for the task client (literal values; quote them when rendering).

    - `CKPTEVAL_OFFLINE_DATA`: `on` always serves packaged data, `off` never, `auto` when the hub is not
      reachable (decided inside the job, where the harness runs);
    - `CKPTEVAL_DATASET_DIR`: a directory of datasets saved with `save_to_disk`, used before anything else;
    - `HF_ALLOW_CODE_EVAL=1`: HumanEval-style tasks execute generated code (sandboxed offline, see
      `ckpteval_sandbox`); the harness refuses without it;
    - `NEMO_EVALUATOR_LOG_LEVEL`: the interceptor proxy logs two lines per request at INFO, which costs
      throughput and buries errors; WARNING keeps failures and retries visible;
    - `NEMO_EVALUATOR_TELEMETRY_LEVEL=0` unless `telemetry`: nemo-evaluator reports each task (with the model
      name) to NVIDIA by default; a job evaluating a private checkpoint should not, and offline it only waits.
    """
    if offline_data not in ("auto", "on", "off"):
        raise ValueError(f"offline_data must be auto, on or off, not {offline_data!r}")
    env = {
        "CKPTEVAL_OFFLINE_DATA": offline_data,
        "HF_ALLOW_CODE_EVAL": "1",
        "NEMO_EVALUATOR_LOG_LEVEL": log_level,
    }
    if not telemetry:
        env["NEMO_EVALUATOR_TELEMETRY_LEVEL"] = "0"
    if dataset_dir:
        env["CKPTEVAL_DATASET_DIR"] = dataset_dir
    return env
