"""One test per precedence level: defaults < -c configs (left to right) < profile < CLI overrides < -t."""

from __future__ import annotations

from pathlib import Path

from ckpteval.config.compose import CompileRequest, compose

PROFILE = """
[wandb]
project = "from-profile"

[cluster]
host = "login.example.com"
account = "acct-from-profile"
remote_job_dir = "/lustre/me"
"""


def stage(dir_: Path, name: str, body: str) -> str:
    path = dir_ / f"{name}.yaml"
    path.write_text(body)
    return str(path)


def data(**kw) -> dict:
    return compose(CompileRequest(**kw)).data


def test_level1_packaged_defaults_alone():
    d = data(overrides=("run.model=/ckpt",))
    assert d["execution"]["type"] == "local"
    assert d["deployment"]["type"] == "megatron"
    assert d["evaluation"]["nemo_evaluator_config"]["config"]["params"]["parallelism"] == 8


def test_level2_stage_config_beats_defaults(isolated_user: Path):
    a = stage(isolated_user, "a", "evaluation:\n  nemo_evaluator_config: {config: {params: {parallelism: 3}}}\n")
    d = data(configs=(a,), overrides=("run.model=/ckpt",))
    assert d["evaluation"]["nemo_evaluator_config"]["config"]["params"]["parallelism"] == 3


def test_level2_configs_compose_left_to_right(isolated_user: Path):
    a = stage(
        isolated_user,
        "a",
        "defaults:\n  - override /deployment: vllm\n  - _self_\n"
        "evaluation:\n  nemo_evaluator_config: {config: {params: {parallelism: 3, max_retries: 9}}}\n",
    )
    b = stage(isolated_user, "b", "evaluation:\n  nemo_evaluator_config: {config: {params: {parallelism: 4}}}\n")
    d = data(configs=(a, b), overrides=("run.model=/ckpt",))
    params = d["evaluation"]["nemo_evaluator_config"]["config"]["params"]
    assert params["parallelism"] == 4  # b wins
    assert params["max_retries"] == 9  # a's value survives where b is silent
    assert d["deployment"]["type"] == "vllm"  # a's group override survives too
    d = data(configs=(b, a), overrides=("run.model=/ckpt",))
    assert d["evaluation"]["nemo_evaluator_config"]["config"]["params"]["parallelism"] == 3


def test_level3_profile_beats_stage_configs(isolated_user: Path, write_env):
    write_env(PROFILE)
    a = stage(
        isolated_user,
        "a",
        "run:\n  wandb: {project: from-stage}\ndefaults:\n  - override /execution: local\n  - _self_\n",
    )
    d = data(configs=(a,), profile="cluster", mode="batch", overrides=("run.model=/ckpt",))
    assert d["run"]["wandb"]["project"] == "from-profile"
    assert d["execution"]["type"] == "slurm"  # the profile's executor picks the execution group
    assert d["execution"]["account"] == "acct-from-profile"


def test_level4_cli_overrides_beat_profile(write_env):
    write_env(PROFILE)
    d = data(
        profile="cluster", mode="batch", overrides=("run.model=/ckpt", "run.wandb.project=from-cli", "execution=local")
    )
    assert d["run"]["wandb"]["project"] == "from-cli"
    assert d["execution"]["type"] == "local"


def test_level5_task_filter_beats_overrides():
    d = data(
        configs=("sft",),
        overrides=("run.model=/ckpt", "evaluation.tasks=[{name: gsm8k}, {name: hellaswag}]"),
        tasks=("hellaswag",),
    )
    assert [t["name"] for t in d["evaluation"]["tasks"]] == ["hellaswag"]


def test_task_filter_keeps_task_settings_and_order():
    d = data(
        configs=("sft",),
        overrides=(
            "run.model=/ckpt",
            "+evaluation.tasks.1.nemo_evaluator_config={config: {params: {limit_samples: 7}}}",
        ),
        tasks=("hellaswag", "adlr_mmlu"),
    )
    tasks = d["evaluation"]["tasks"]
    assert [t["name"] for t in tasks] == ["hellaswag", "adlr_mmlu"]
    assert tasks[0]["nemo_evaluator_config"]["config"]["params"]["limit_samples"] == 7


def test_task_filter_adds_catalog_task_not_in_config():
    composed = compose(CompileRequest(configs=("tiny",), tasks=("hellaswag",)))
    assert [t["name"] for t in composed.data["evaluation"]["tasks"]] == ["hellaswag"]
    assert composed.added_tasks == ("hellaswag",)


def test_user_config_dir_shadows_packaged(isolated_user: Path, monkeypatch):
    mine = isolated_user / "confs"
    mine.mkdir()
    (mine / "tiny.yaml").write_text("evaluation:\n  tasks: [{name: gsm8k}]\nrun: {model: /x}\n")
    monkeypatch.setenv("CKPTEVAL_CONFIG_PATH", str(mine))
    d = data(configs=("tiny",))
    assert [t["name"] for t in d["evaluation"]["tasks"]] == ["gsm8k"]
