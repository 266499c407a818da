"""Export-Deploy's parallel layout and speed settings, validated when the config compiles (before the queue)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.config.schema import MegatronDeployment
from ckpteval.errors import ConfigError

PROFILE = """
[CLUSTER]
executor = "slurm"
host = "login.cluster.invalid"
account = "llm"
remote_job_dir = "/lustre/me/ckpteval"
container_image = "nvcr.io/nvidia/nemo:25.11"
gpus_per_node = 8
nodes = 2
"""


def compiled_deployment(env: Path, *overrides: str) -> MegatronDeployment:
    request = CompileRequest(
        configs=("sft",),
        profile="CLUSTER",
        mode="run",
        overrides=("run.model=/lustre/ckpt", "export.wandb.enabled=false", *overrides),
        env_file=env,
    )
    deployment = compile_config(request).config.deployment
    assert isinstance(deployment, MegatronDeployment)
    return deployment


@pytest.fixture
def env(write_env) -> Path:  # type: ignore[no-untyped-def]
    return write_env(PROFILE)


def test_defaults_use_every_gpu_of_every_node(env: Path):
    d = compiled_deployment(env)
    assert (d.backend, d.num_gpus, d.num_replicas) == ("export-deploy", 8, None)
    assert compiled_deployment(env, "deployment.num_nodes=2").num_gpus == 16  # gpus_per_node x num_nodes


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("deployment.num_replicas=2",), "TP×PP×CP×EP×replicas = 1×1×1×1×2 = 2 GPUs, but deployment.num_gpus=8"),
        (
            ("deployment.tensor_model_parallel_size=3",),
            "TP×PP×CP×EP×replicas = 3×1×1×1×2 = 6 GPUs, but deployment.num_gpus=8",
        ),
        (
            ("deployment.tensor_model_parallel_size=4", "deployment.context_parallel_size=4"),
            "= 4×1×4×1×1 = 16 GPUs, but deployment.num_gpus=8",
        ),
        (("deployment.context_parallel_size=0",), "deployment.context_parallel_size must be at least 1, not 0"),
        (("deployment.micro_batch_size=0",), "deployment.micro_batch_size must be at least 1"),
        (("deployment.micro_batch_size=32",), "micro_batch_size=32 is larger than max_batch_size=16"),
        (("deployment.num_layers_in_first_pipeline_stage=4",), "but pipeline_model_parallel_size is 1"),
        (("deployment.num_gpus=9", "deployment.num_nodes=2", "deployment.num_replicas=9"), "does not split evenly"),
        (("deployment.num_gpus=24", "deployment.num_nodes=2"), "deployment.num_gpus=24 is more than 2 node(s) × 8"),
        (  # prepare writes only into ckpteval's cache (elsewhere run.model is the user's and prepare is off)
            ("deployment.prepare=tiny", "run.model=${execution.cache_dir}/checkpoints/tiny"),
            "Export-Deploy serves a checkpoint that exists already",
        ),
    ],
)
def test_layouts_export_deploy_would_refuse_are_refused_here(env: Path, overrides: tuple[str, ...], message: str):
    with pytest.raises(ConfigError) as err:
        compiled_deployment(env, *overrides)
    assert message in str(err.value)


def test_valid_layouts_compile(env: Path):
    d = compiled_deployment(
        env,
        "deployment.tensor_model_parallel_size=2",
        "deployment.pipeline_model_parallel_size=2",
        "deployment.num_layers_in_first_pipeline_stage=7",
        "deployment.enable_cuda_graphs=true",
        "deployment.micro_batch_size=4",
    )
    assert (d.num_replicas, d.enable_cuda_graphs, d.micro_batch_size) == (None, True, 4)
    moe = compiled_deployment(env, "deployment.expert_model_parallel_size=8", "deployment.num_replicas=1")
    assert moe.expert_model_parallel_size == 8


@pytest.mark.parametrize(
    "override",
    [
        "deployment.enable_cuda_graphs=true",
        "deployment.enable_flash_decode=true",
        "deployment.micro_batch_size=2",
    ],
)
def test_the_builtin_server_refuses_export_deploy_settings(isolated_user: Path, override: str):
    with pytest.raises(ConfigError, match="is an Export-Deploy setting; the builtin server does not use it"):
        compile_config(CompileRequest(configs=("tiny",), overrides=(override,)))


def test_the_builtin_server_takes_num_replicas(isolated_user: Path):
    """The builtin backend runs num_replicas server processes behind one port (server/router.py)."""
    compiled = compile_config(CompileRequest(configs=("tiny",), overrides=("deployment.num_replicas=2",)))
    assert compiled.config.deployment.num_replicas == 2
