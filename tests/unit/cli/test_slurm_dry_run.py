"""`--dry-run` on a Slurm profile: the sbatch script, the job script and the squash plan, without connecting
anywhere and without importing nemo-run (12-25 s) or paramiko."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROFILE = """
[CLUSTER]
executor = "slurm"
host = "login.cluster.invalid"
account = "llm"
partition = "batch"
nodes = 2
remote_job_dir = "/lustre/me/ckpteval"
container_image = "nvcr.io/nvidia/nemo:25.11"
sbatch_flags = { exclusive = true }
"""


def dry_run(*overrides: str, python_flags: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess[str]:
    """`evaluate -c sft --run CLUSTER -d OVERRIDES` in a new process (wide terminal, `env` added)."""
    return subprocess.run(
        [sys.executable, *python_flags, "-m", "ckpteval.cli", "-c", "sft", "--run", "CLUSTER", "-d", *overrides],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400", **env},
    )


def unboxed(stdout: str) -> str:
    """The panels wrap long lines: the text without the borders, lines joined by spaces."""
    return " ".join(" ".join(line.strip().strip("│").split()) for line in stdout.splitlines())


def test_slurm_dry_run_renders_everything_and_imports_no_submission_machinery(isolated_user: Path, write_env):
    write_env(PROFILE)
    proc = dry_run(
        "run.model=/lustre/me/ckpt",
        "export.wandb.enabled=false",  # sft exports to W&B; this test has no W&B project
        python_flags=("-X", "importtime"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = unboxed(proc.stdout)
    for text in (
        "#SBATCH --account=llm",
        "#SBATCH --exclusive",
        "#SBATCH --gres=gpu:8",
        "#SBATCH --nodes=2",
        "--nodes=1 --ntasks=1 --overlap bash /lustre/me/ckpteval/evaluations/",
        "srun --job-name=deployment",
        "/opt/Export-Deploy/scripts/deploy/llm/mlm/deploy_ray.py --megatron_checkpoint /lustre/me/ckpt "
        "--model_id megatron-model",
        "--num_gpus 8 --tensor_model_parallel_size 1",
        "--num_replicas 8 --max_batch_size 16",  # one model copy per GPU: Export-Deploy uses every GPU it is given
        "Export-Deploy entry point",
        "known from: default (not probed: the Export-Deploy 0.4-0.6 layout; `--dry-run --check` or a real run",
        "Squash plan",
        "nvcr.io/nvidia/nemo:25.11",
        # sft's tasks score and generate; the default entry point is 0.5+'s, known to batch with the first
        # request's settings: the groups take turns whatever the probe finds
        "The endpoint mixes request settings across a batch: deploy_ray.py takes --batch_wait_timeout_s",
        "groups of identical request settings, one group after another: $why",
        "group 1: adlr_mmlu — adlr_mmlu's generations",
    ):
        assert text in out, text
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "nemo_run" not in imported and "paramiko" not in imported and "torch" not in imported
    assert not (Path(os.environ["XDG_STATE_HOME"]) / "ckpteval").exists()  # nothing recorded


def test_slurm_dry_run_shows_the_in_job_export_and_never_the_key(isolated_user: Path, write_env):
    """A config that exports to W&B: the job script ends with the export step, which reads the key from
    an owner-only file on the cluster; the key itself appears nowhere in what the dry run shows."""
    write_env(PROFILE)
    canary = "canary-wandb-key-0123456789abcdef0123456789abcdef"
    proc = dry_run("run.model=/lustre/me/ckpt", "export.wandb.project=evals", WANDB_API_KEY=canary, WANDB_MODE="online")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = unboxed(proc.stdout)
    assert "-m ckpteval.export --job-dir /lustre/me/ckpteval/evaluations/" in out
    assert "--wandb-key-file /lustre/me/ckpteval/evaluations/" in out and ".secrets/wandb_api_key" in out
    assert canary not in proc.stdout + proc.stderr


def test_slurm_dry_run_without_export_has_no_export_step(isolated_user: Path, write_env):
    write_env(PROFILE)
    proc = dry_run("run.model=/x", "export.wandb.enabled=false")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ckpteval.export" not in proc.stdout


def test_slurm_dry_run_refuses_a_parallel_layout_export_deploy_would_refuse(isolated_user: Path, write_env):
    write_env(PROFILE)
    proc = dry_run("run.model=/x", "export.wandb.enabled=false", "deployment.num_replicas=2")
    assert proc.returncode == 2
    assert "TP×PP×CP×EP×replicas = 1×1×1×1×2 = 2 GPUs, but deployment.num_gpus=8" in unboxed(proc.stderr)
    assert "deployment.num_replicas=8" in proc.stderr and "Traceback" not in proc.stderr


def test_slurm_dry_run_shows_the_speed_settings_it_passes(isolated_user: Path, write_env):
    write_env(PROFILE)
    proc = dry_run(
        "run.model=/x",
        "export.wandb.enabled=false",
        "deployment.tensor_model_parallel_size=4",
        "deployment.pipeline_model_parallel_size=2",
        "deployment.enable_cuda_graphs=true",
        "deployment.enable_flash_decode=true",
        "deployment.micro_batch_size=8",
        "deployment.max_batch_size=64",
        "deployment.num_layers_in_first_pipeline_stage=15",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = unboxed(proc.stdout)
    assert "--num_replicas 1 --max_batch_size 64 --micro_batch_size 8 --enable_cuda_graphs --enable_flash_decode" in out
    assert "--num_layers_in_first_pipeline_stage 15" in out


def test_slurm_dry_run_places_a_judge_on_a_node_of_its_own(isolated_user: Path, write_env):
    """judge=builtin on Slurm: the allocation holds the model's node and the judge's (the profile asks for
    one), the judge's step runs on the second, reached at its name; the run header says where."""
    write_env(PROFILE.replace("nodes = 2", "nodes = 1"))
    proc = dry_run(
        "-t", "mtbench", "run.model=/lustre/me/ckpt", "export.wandb.enabled=false",
        "judge=builtin", "judge.checkpoint_path=/lustre/me/judge",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = unboxed(proc.stdout)
    assert "judge: /lustre/me/judge (megatron, builtin backend, a second server on node 2 of the allocation)" in out
    assert "#SBATCH --nodes=2" in out
    assert "--job-name=judge" in out and '--nodelist="$(step_nodes 1 1)"' in out
    assert 'JUDGE_HOST="$(step_nodes 1 1)"; export JUDGE_HOST' in out
    assert "--host 0.0.0.0" in out and "/lustre/me/judge" in out


def test_slurm_dry_run_places_a_vllm_judge_on_a_node_of_its_own(isolated_user: Path, write_env):
    """judge=vllm on Slurm: vLLM in its image on the second node of the allocation, reached at its name on the
    port it was given (vLLM publishes none), its identity a second served model name; its image squashed."""
    write_env(PROFILE.replace("nodes = 2", "nodes = 1"))
    proc = dry_run(
        "-t", "mtbench", "run.model=/lustre/me/ckpt", "export.wandb.enabled=false",
        "judge=vllm", "judge.checkpoint_path=/lustre/me/hf-judge", "judge.image=vllm/vllm-openai:v0.11.0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = unboxed(proc.stdout)
    assert "judge: /lustre/me/hf-judge (vLLM, a second server on node 2 of the allocation)" in out
    assert "#SBATCH --nodes=2" in out
    assert "--job-name=judge" in out and '--nodelist="$(step_nodes 1 1)"' in out
    assert "vllm serve /lustre/me/hf-judge" in out and "--served-model-name judge " in out
    assert 'JUDGE_HEALTH_URL="http://${JUDGE_HOST}:8001/health"' in out
    assert 'JUDGE_IDENTITY_URL="http://${JUDGE_HOST}:8001/v1/models"' in out
    assert "config.params.extra.judge.url=http://${JUDGE_HOST}:8001/v1" in out  # the harness, at its node
    assert "judge.image" in out and "vllm/vllm-openai:v0.11.0" in out  # squashed like the model's image
