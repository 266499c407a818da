"""Export-Deploy's entry points as each release ships them: what `--help` tells us, and the command we build."""

from __future__ import annotations

import argparse
import shlex

import pytest

from ckpteval.config.schema import Endpoints, MegatronDeployment
from ckpteval.deploy.export_deploy import (
    DEFAULT_ENTRY_POINT,
    MLM_FLAGS,
    EntryPoint,
    export_deploy_argv,
    export_deploy_command,
    parse_help,
    replicas,
)
from ckpteval.errors import ConfigError

# the long flags of each release's script, in its argparse order (Export-Deploy tags, read from the repository)
NLP_V011 = [
    "--nemo_checkpoint",
    "--num_gpus",
    "--num_nodes",
    "--tensor_model_parallel_size",
    "--pipeline_model_parallel_size",
    "--expert_model_parallel_size",
    "--context_parallel_size",
    "--model_id",
    "--host",
    "--port",
    "--num_cpus",
    "--num_cpus_per_replica",
    "--include_dashboard",
    "--cuda_visible_devices",
    "--enable_cuda_graphs",
    "--enable_flash_decode",
    "--num_replicas",
    "--legacy_ckpt",
]
NLP_V031 = [
    "--nemo_checkpoint",
    "--num_gpus",
    "--tensor_model_parallel_size",
    "--pipeline_model_parallel_size",
    "--num_layers_in_first_pipeline_stage",
    "--num_layers_in_last_pipeline_stage",
    "--expert_model_parallel_size",
    "--context_parallel_size",
    "--account_for_embedding_in_pipeline_split",
    "--account_for_loss_in_pipeline_split",
    "--model_id",
    "--host",
    "--port",
    "--num_cpus",
    "--num_cpus_per_replica",
    "--include_dashboard",
    "--cuda_visible_devices",
    "--enable_cuda_graphs",
    "--enable_flash_decode",
    "--num_replicas",
    "--legacy_ckpt",
    "--max_batch_size",
    "--random_seed",
    "--megatron_checkpoint",
    "--model_type",
    "--micro_batch_size",
    "--runtime_env",
]
STORE_TRUE = {
    "--include_dashboard",
    "--enable_cuda_graphs",
    "--enable_flash_decode",
    "--legacy_ckpt",
    "--account_for_embedding_in_pipeline_split",
    "--account_for_loss_in_pipeline_split",
}


def help_text(prog: str, flags: list[str], required: tuple[str, ...] = ()) -> str:
    """What `python <prog> --help` prints for a script with these arguments (argparse's own output)."""
    parser = argparse.ArgumentParser(prog=prog, description="Deploy a Megatron model using Ray")
    for flag in flags:
        if flag in STORE_TRUE:
            parser.add_argument(flag, action="store_true", help="a switch")
        else:
            parser.add_argument(flag, required=flag in required, help="a value")
    return parser.format_help()


def deployment(**overrides) -> MegatronDeployment:
    values = dict(
        type="megatron",
        backend="export-deploy",
        checkpoint_path="/lustre/ckpt",
        tokenizer=None,
        served_model_name="megatron-model",
        image="nvcr.io/nvidia/nemo:25.11",
        num_gpus=8,
        endpoints=Endpoints(completions="/v1/completions/", chat="/v1/chat/completions/", health="/v1/health"),
    )
    values.update(overrides)
    return MegatronDeployment(**values)  # type: ignore[arg-type]


def probed(flags: list[str], required: tuple[str, ...] = (), script: str = "/opt/x.py") -> EntryPoint:
    all_flags, req = parse_help(help_text(script.rsplit("/", 1)[-1], flags, required))
    return EntryPoint(script=script, flags=all_flags, required=req, source="probe", where="/c/x.export-deploy.json")


def test_help_parsing_finds_every_flag_and_the_required_ones():
    flags, required = parse_help(help_text("deploy_ray_inframework.py", NLP_V011, required=("--nemo_checkpoint",)))
    assert flags == {*NLP_V011, "--help"}
    assert required == {"--nemo_checkpoint"}
    flags, required = parse_help(help_text("deploy_ray.py", sorted(MLM_FLAGS)))
    assert flags - {"--help"} == MLM_FLAGS and not required


def test_default_command_is_the_mlm_script_with_every_replica_that_fits():
    argv = export_deploy_argv(deployment(), DEFAULT_ENTRY_POINT, port=8000)
    assert shlex.join(argv) == (
        "python /opt/Export-Deploy/scripts/deploy/llm/mlm/deploy_ray.py --megatron_checkpoint /lustre/ckpt "
        "--model_id megatron-model --host 0.0.0.0 --port 8000 --num_gpus 8 --tensor_model_parallel_size 1 "
        "--pipeline_model_parallel_size 1 --expert_model_parallel_size 1 --num_replicas 8 --max_batch_size 16"
    )


def test_speed_settings_reach_the_script():
    d = deployment(
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=2,
        context_parallel_size=2,
        micro_batch_size=4,
        max_batch_size=64,
        enable_cuda_graphs=True,
        enable_flash_decode=True,
        num_layers_in_first_pipeline_stage=11,
        num_layers_in_last_pipeline_stage=13,
    )
    assert replicas(d) == 1
    line = shlex.join(export_deploy_argv(d, DEFAULT_ENTRY_POINT, port=8000))
    for part in (
        "--context_parallel_size 2",
        "--num_replicas 1",
        "--max_batch_size 64",
        "--micro_batch_size 4",
        "--enable_cuda_graphs --enable_flash_decode",
        "--num_layers_in_first_pipeline_stage 11 --num_layers_in_last_pipeline_stage 13",
    ):
        assert part in line, part


def test_the_older_nlp_script_of_03_serves_megatron_checkpoints():
    entry = probed(NLP_V031, script="/opt/Export-Deploy/scripts/deploy/nlp/deploy_ray_inframework.py")
    argv = export_deploy_argv(deployment(num_replicas=8, enable_cuda_graphs=True), entry, port=8000)
    assert argv[:4] == ["python", entry.script, "--megatron_checkpoint", "/lustre/ckpt"]
    assert "--enable_cuda_graphs" in argv


def test_a_nemo_only_script_is_refused_before_the_queue():
    entry = probed(NLP_V011, required=("--nemo_checkpoint",))
    with pytest.raises(ConfigError, match="NeMo-2 checkpoints only") as err:
        export_deploy_argv(deployment(), entry, port=8000)
    assert "Export-Deploy 0.2 or newer" in (err.value.hint or "")


def test_a_setting_the_script_lacks_is_one_clear_error():
    flags = [f for f in NLP_V031 if f != "--micro_batch_size"]
    entry = probed(flags)
    export_deploy_argv(deployment(), entry, port=8000)  # fine while micro_batch_size is not set
    with pytest.raises(ConfigError, match=r"deployment\.micro_batch_size needs Export-Deploy's --micro_batch_size"):
        export_deploy_argv(deployment(micro_batch_size=2), entry, port=8000)


def test_a_required_flag_ckpteval_does_not_pass_is_refused():
    entry = probed([*NLP_V031, "--tokenizer_dir"], required=("--tokenizer_dir",))
    with pytest.raises(ConfigError, match="requires --tokenizer_dir"):
        export_deploy_argv(deployment(), entry, port=8000)


def test_version_01_takes_gpus_per_node_and_nodes():
    flags = [*NLP_V011, "--megatron_checkpoint"]  # 0.1's layout with a checkpoint flag we can use
    line = shlex.join(export_deploy_argv(deployment(num_gpus=16, num_nodes=2), probed(flags), port=8000))
    assert "--num_gpus 8 --num_nodes 2" in line


def test_several_nodes_run_a_ray_head_and_workers_and_stop_ray_on_every_node():
    d = deployment(num_gpus=16, num_nodes=2, num_replicas=2, tensor_model_parallel_size=8)
    command = export_deploy_command(d, DEFAULT_ENTRY_POINT, port=8000)
    assert command.startswith("stop_ray() {") and "ray stop --force" in command and "pgrep -s 0" in command
    assert "trap stop_ray EXIT;" in command
    # each `ray start` is bounded (a busy node can leave it waiting on a raylet that died), then tried again
    assert (
        "until timeout -k 10 120 ray start --head --port=6379 --num-gpus=8 --disable-usage-stats "
        "--include-dashboard=false; do" in command
    )
    assert (
        'until timeout -k 10 120 ray start --address="$PRIMARY_NODE:6379" --num-gpus=8 --disable-usage-stats; do'
        in command
    )
    assert "the Ray head did not start on $(hostname) in 5 attempts" in command  # said where the user looks
    assert "while pgrep -s 0 -f ray/raylet" in command  # a worker leaves when its raylet does (head gone)
    assert "--num_gpus 16" in command and "--num_replicas 2" in command
    extra = export_deploy_command(
        deployment(num_gpus=16, num_nodes=2, num_replicas=16, ray_start_args="--num-cpus=$((4 + 1))"),
        DEFAULT_ENTRY_POINT,
        port=8000,
    )
    assert extra.count("--disable-usage-stats --num-cpus=$((4 + 1))") == 2  # head and workers alike
    single = export_deploy_command(deployment(), DEFAULT_ENTRY_POINT, port=8000)
    assert single.startswith("exec python ") and "ray start" not in single


def test_entry_point_cache_round_trip():
    entry = probed(NLP_V031)
    back = EntryPoint.from_json(entry.to_json(), source="cache", where="/c/f.json")
    assert (back.script, back.flags, back.required, back.source) == (entry.script, entry.flags, entry.required, "cache")
    with pytest.raises(ValueError):
        EntryPoint.from_json("[]", source="cache", where="x")
