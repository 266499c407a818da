"""vLLM and SGLang on a Megatron checkpoint, as the job plans them: `deployment=vllm|sglang run.model=<Megatron
checkpoint>` gets an export step before the engine (ckpteval's Python exporting into the cache where the job
runs, linked into the job directory), the engine serves the link with the config's name, port and parallel
sizes, and the task clients read the export's tokenizer; a Hugging Face directory gets no step."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ckpteval.config.compile import CompiledConfig, compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.errors import ConfigError
from ckpteval.execution.slurm import slurm_toolchain
from ckpteval.job.build import build_plan, local_toolchain
from ckpteval.job.plan import JobPlan
from ckpteval.job.script import render_job_script

PY = "/opt/venv/bin/python"
JOB = "/lustre/ckpteval/evaluations/inv1"
CKPT = "/lustre/ckpts/llama-sft"
CACHE = "/lustre/ckpteval/cache/hf-exports"
LINK = f"{JOB}/hf_export"


def _cluster(tmp_path: Path, *overrides: str) -> CompiledConfig:
    env = tmp_path / "env.toml"
    env.write_text(
        '[C]\nexecutor = "slurm"\ntunnel = "local"\naccount = "a"\npartition = "p"\n'
        f'remote_job_dir = "/lustre/ckpteval"\npython = "{PY}"\n'
    )
    request = CompileRequest(
        configs=("tiny",),
        profile="C",
        mode="batch",
        env_file=env,
        tasks=("hellaswag",),
        overrides=(f"run.model={CKPT}", "deployment.image=vllm/vllm-openai:v0.11.0", *overrides),
    )
    return compile_config(request)


def _plan(compiled: CompiledConfig, layout: str | None = None) -> JobPlan:
    return build_plan(
        compiled,
        invocation="inv1",
        job_dir=JOB,
        toolchain=slurm_toolchain(PY, JOB),
        launcher="srun-containers",
        checkpoint_layout=layout,
    )


def _tokenizer(plan: JobPlan) -> str:
    return plan.tasks[0].runs[0].run_config["config"]["params"]["extra"]["tokenizer"]


def test_vllm_on_a_megatron_checkpoint_exports_first_then_serves_the_export(tmp_path: Path) -> None:
    plan = _plan(_cluster(tmp_path, "deployment=vllm", "deployment.tensor_parallel_size=2"), layout="megatron-lm")
    export = plan.deployment.export_step
    assert export is not None
    assert export.command == (
        f"exec {PY} -m ckpteval.hfexport cached {CKPT} --cache {CACHE} --link {LINK} "
        f"--report {JOB}/state/hf_export.json --dtype checkpoint"
    )
    assert export.image is None  # the profile names no image: the node's Python, as the builtin server's
    step = plan.deployment.step
    assert step is not None and step.image == "vllm/vllm-openai:v0.11.0"
    assert step.command.startswith(f"vllm serve {LINK} --tensor-parallel-size=2 --pipeline-parallel-size=1 ")
    identity = plan.deployment.identity
    assert identity and f"--served-model-name model {identity}" in step.command  # the job's identity beside it
    assert plan.deployment.identity_url == "http://127.0.0.1:8000/v1/models"
    assert f"{CACHE}:{CACHE}:ro" in step.mounts  # the link's target, inside the engine's container
    assert _tokenizer(plan) == LINK  # the clients count tokens with the export's tokenizer

    script = render_job_script(plan, launcher="srun-containers")
    exporting = script.index("--job-name=export")
    assert exporting < script.index("starting the deployment (vllm)")
    assert "the export step failed (exit $rc): the engine is not started" in script


def test_sglang_is_a_deployment_of_the_same_export(tmp_path: Path) -> None:
    compiled = _cluster(
        tmp_path, "deployment=sglang", "deployment.data_parallel_size=2", "deployment.export_dtype=bfloat16"
    )
    plan = _plan(compiled, layout="megatron-bridge")
    assert plan.deployment.kind == "sglang"
    assert plan.deployment.export_step is not None and "--dtype bfloat16" in plan.deployment.export_step.command
    step = plan.deployment.step
    identity = plan.deployment.identity
    assert (
        identity
        and step is not None
        and step.command
        == (
            f"python3 -m sglang.launch_server --model-path {LINK} --host 0.0.0.0 --port 8000 --served-model-name model "
            f"--tp-size=8 --dp-size=2 --trust-remote-code --weight-version {identity}"
        )
    )
    # one served name only: the job's identity is its weight version, which /get_model_info reports
    assert plan.deployment.identity_url == "http://127.0.0.1:8000/get_model_info"
    assert step.image == "vllm/vllm-openai:v0.11.0"  # the image the test's overrides name
    assert plan.deployment.health_url == "http://127.0.0.1:8000/health"
    assert _tokenizer(plan) == LINK


def test_a_hugging_face_directory_is_served_as_it_is(tmp_path: Path) -> None:
    compiled = _cluster(tmp_path, "deployment=vllm")
    undescribed = _plan(compiled)  # a cluster dry run: the step decides in the job (links an HF dir as it is)
    assert undescribed.deployment.export_step is not None
    described = _plan(compiled, layout="huggingface")
    assert described.deployment.export_step is None
    assert described.deployment.step is not None
    assert described.deployment.step.command.startswith(f"vllm serve {CKPT} ")
    assert _tokenizer(described) == CKPT
    handle = _plan(_cluster(tmp_path, "deployment=vllm", "deployment.hf_model_handle=org/model"))
    assert handle.deployment.export_step is None


def test_a_named_tokenizer_goes_to_the_export_and_stays_the_clients(tmp_path: Path) -> None:
    plan = _plan(_cluster(tmp_path, "deployment=vllm", "deployment.tokenizer=/lustre/tok"), layout="megatron-lm")
    assert plan.deployment.export_step is not None
    assert plan.deployment.export_step.command.endswith("--dtype checkpoint --tokenizer /lustre/tok")
    assert _tokenizer(plan) == "/lustre/tok"


def _standin_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    vllm = bin_dir / "vllm"
    vllm.write_text("#!/bin/sh\nexit 0\n")
    vllm.chmod(vllm.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _local(checkpoint: Path, *overrides: str) -> CompiledConfig:
    return compile_config(
        CompileRequest(configs=("tiny",), tasks=("hellaswag",), overrides=(f"run.model={checkpoint}", *overrides))
    )


def test_on_this_machine_vllm_runs_when_installed_and_the_checkpoint_is_read_here(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.raises(ConfigError, match="runs a container image; this machine runs no containers"):
        _local(tiny_checkpoint, "deployment=vllm")
    _standin_vllm(tmp_path, monkeypatch)
    compiled = _local(tiny_checkpoint, "deployment=vllm")
    job_dir = str(tmp_path / "job")
    plan = build_plan(compiled, invocation="i", job_dir=job_dir, toolchain=local_toolchain(), launcher="processes")
    export = plan.deployment.export_step
    assert export is not None and f"-m ckpteval.hfexport cached {tiny_checkpoint} " in export.command
    assert plan.deployment.step is not None and f"vllm serve {job_dir}/hf_export " in plan.deployment.step.command

    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text("{}")
    plan = build_plan(
        _local(hf_dir, "deployment=vllm"), invocation="i", job_dir=job_dir, toolchain=local_toolchain(),
        launcher="processes",
    )  # fmt: skip
    assert plan.deployment.export_step is None


def test_sglang_loaded_into_a_kept_server_exports_then_loads_under_the_job_s_identity(tmp_path: Path) -> None:
    compiled = _cluster(tmp_path, "deployment=sglang", "deployment.load_into=/home/me/watch/run1/deployment")
    plan = _plan(compiled, layout="megatron-lm")
    assert plan.deployment.export_step is not None  # the export is made (or found) as for a fresh SGLang
    step, identity = plan.deployment.step, plan.deployment.identity
    assert (
        identity
        and step is not None
        and step.command
        == (
            f"exec {PY} -m ckpteval.deploy.sglang_inplace --load-into /home/me/watch/run1/deployment "
            f"--model-path {LINK} --identity {identity} --port-file {JOB}/state/deployment_port"
        )
    )
    assert step.image is None  # ckpteval's Python asks the kept SGLang; no engine starts
    assert plan.deployment.port_file == f"{JOB}/state/deployment_port"  # the job reads the kept server's port
    assert plan.deployment.identity_url == "http://127.0.0.1:8000/get_model_info"
    script = render_job_script(plan, launcher="srun-containers")
    assert script.index("--job-name=export") < script.index("ckpteval.deploy.sglang_inplace")


def test_the_export_step_takes_the_pinned_iteration_no_tracker_is_checked_before_the_engine(tmp_path: Path) -> None:
    plan = build_plan(
        _cluster(tmp_path, "deployment=sglang"),
        invocation="inv1",
        job_dir=JOB,
        toolchain=slurm_toolchain(PY, JOB),
        launcher="srun-containers",
        checkpoint_layout="megatron-lm",
        pinned="2",
    )
    assert plan.deployment.export_step is not None and "--pinned 2" in plan.deployment.export_step.command
    # an iteration directory (what watch evaluates) has no tracker: the engine serves the pinned export
    assert plan.deployment.pinned_tracker is None


def test_on_this_machine_sglang_runs_when_this_python_imports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.sglang_standin import install

    with pytest.raises(ConfigError, match="sglang runs a container image; this machine runs no containers"):
        _local(tmp_path, "deployment=sglang")
    monkeypatch.syspath_prepend(str(install(tmp_path / "shim")))  # SGLang installed (the stand-in)
    assert _local(tmp_path, "deployment=sglang").config.deployment.type == "sglang"
