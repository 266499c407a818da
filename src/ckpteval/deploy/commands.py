"""The command lines that start a deployment inside a job, by `deployment.type` (and megatron's backend).

- megatron/builtin: ckpteval's own megatron-core server (`python -m ckpteval.server serve ...`, its flags
  from `ServeOptions.to_argv`: the config's settings become the server's options here, and only here)
- vllm: `vllm serve` in the vLLM image
- sglang: `python3 -m sglang.launch_server` in the SGLang image
- generic: the configured command, as written

(megatron/export-deploy's Ray Serve command is `deploy.export_deploy.export_deploy_command`.)
Each returns one bash command line; every argument that comes from the config is quoted.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ckpteval.config.schema import (
    FROM_CHECKPOINT,
    GenericDeployment,
    MegatronDeployment,
    SglangDeployment,
    VllmDeployment,
)
from ckpteval.server.options import ServeOptions


def builtin_command(
    deployment: MegatronDeployment,
    *,
    python: str,
    port: int,
    publish_tokenizer: str | None = None,
    identity: str | None = None,
    port_file: str | None = None,
    iteration: str | None = None,
    report_file: str | None = None,
    host: str = "127.0.0.1",
) -> str:
    """The builtin server on `host`:`port` (127.0.0.1 by default), run by `python` (which must import
    ckpteval); it writes the tokenizer it serves with to `publish_tokenizer` first, for the task clients.
    `identity`: the token it reports; `port_file`: where it writes the port it holds (`port`, or another if
    that one is taken);
    `iteration`: the one it serves (pinned by the job), whatever the tracker names when it loads;
    `report_file`: where it writes what it loaded (`ckpteval.server.loaded`)."""
    options = ServeOptions(
        checkpoint=Path(deployment.checkpoint_path),
        iteration=iteration,
        port=port,
        host=host,
        served_model_name=deployment.served_model_name,
        device=deployment.device,
        max_batch_size=deployment.max_batch_size,
        prepare=deployment.prepare,
        replicas=deployment.num_replicas or 1,  # null (export-deploy's 'as many as fit') is one here
        tokenizer=None if deployment.tokenizer in (None, FROM_CHECKPOINT) else deployment.tokenizer,
        ignore_unexpected_tensors=deployment.ignore_unexpected_tensors,
        publish_tokenizer=None if publish_tokenizer is None else Path(publish_tokenizer),
        prefix_cache=deployment.prefix_cache,
        prefix_cache_mib=deployment.prefix_cache_mib,
        identity=identity,
        port_file=None if port_file is None else Path(port_file),
        port_fallback=port_file is not None,
        report_file=None if report_file is None else Path(report_file),
        access_log=deployment.access_log,
        load_into=Path(deployment.load_into) if deployment.load_into else None,
    )
    argv = options.to_argv(python)
    return "exec " + shlex.join(argv)


def vllm_command(
    deployment: VllmDeployment, *, port: int, identity: str | None = None, model: str | None = None
) -> str:
    """`vllm serve` of `model` (the export of a Megatron checkpoint), else the HF handle or the checkpoint path,
    on `port`; `extra_args` go last, as written. `identity` becomes a second served model name: vLLM answers to
    both and lists both in /v1/models, where the job checks it (responses name the first, the one the tasks use)."""
    model = model or deployment.hf_model_handle or deployment.checkpoint_path or ""
    argv = [
        "vllm",
        "serve",
        model,
        f"--tensor-parallel-size={deployment.tensor_parallel_size}",
        f"--pipeline-parallel-size={deployment.pipeline_parallel_size}",
        f"--data-parallel-size={deployment.data_parallel_size}",
        "--port",
        str(port),
        "--served-model-name",
        deployment.served_model_name,
        *([identity] if identity else []),
        "--gpu-memory-utilization",
        str(deployment.gpu_memory_utilization),
        "--trust-remote-code",
    ]
    return shlex.join(argv) + (f" {deployment.extra_args}" if deployment.extra_args else "")


def sglang_command(
    deployment: SglangDeployment,
    *,
    port: int,
    model: str | None = None,
    identity: str | None = None,
    python: str = "python3",
) -> str:
    """SGLang's OpenAI-compatible server on `model` (the export of a Megatron checkpoint), else the HF handle or
    the checkpoint path, on `port`, with the config's tensor and data parallel sizes; `extra_args` go last.
    SGLang serves one model name: `identity` is its weight version (`--weight-version`), which it reports on
    /get_model_info (where the job checks it) and in each completion's `metadata`, and which a load from disk
    replaces (`deploy.sglang_inplace`). `python`: the image's `python3`, or this machine's interpreter."""
    argv = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model or deployment.hf_model_handle or deployment.checkpoint_path or "",
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        "--served-model-name",
        deployment.served_model_name,
        f"--tp-size={deployment.tensor_parallel_size}",
        f"--dp-size={deployment.data_parallel_size}",
        "--trust-remote-code",
    ]
    if identity:
        argv += ["--weight-version", identity]
    if deployment.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(deployment.mem_fraction_static)]
    return shlex.join(argv) + (f" {deployment.extra_args}" if deployment.extra_args else "")


def sglang_load_command(
    deployment: SglangDeployment, *, python: str, model: str | None, identity: str, port_file: str | None
) -> str:
    """No server of its own: load `model` (the export) into the kept SGLang server of `deployment.load_into` under
    `identity` and stand for it (`deploy.sglang_inplace`), run by `python` (which must import ckpteval)."""
    argv = [
        python,
        "-m",
        "ckpteval.deploy.sglang_inplace",
        "--load-into",
        str(deployment.load_into),
        "--model-path",
        model or deployment.hf_model_handle or deployment.checkpoint_path or "",
        "--identity",
        identity,
    ]
    if port_file:
        argv += ["--port-file", port_file]
    return "exec " + shlex.join(argv)


def generic_command(deployment: GenericDeployment) -> str:
    """The user's own command line (a shell line they wrote; not re-quoted)."""
    return deployment.command
