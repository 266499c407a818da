"""Tasks with different request settings never run at once against a deployment that batches clients together
(Export-Deploy 0.5+ runs a batch with its first request's settings); tasks with the same settings still do."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ckpteval.cluster.export_deploy import grouping_note, with_entry_point
from ckpteval.config.compile import CompiledConfig, compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.config.schema import MegatronDeployment
from ckpteval.deploy.export_deploy import DEFAULT_ENTRY_POINT, MLM_FLAGS, batches_across_clients
from ckpteval.job.batching import RequestSettings, task_groups
from ckpteval.job.build import Toolchain, build_plan
from ckpteval.job.plan import JobPlan

GREEDY = {"task": "gsm8k", "temperature": 1e-07, "top_p": 0.9999999}


def gen(route: str = "completions", request_params: dict | None = None, **params: object) -> RequestSettings:
    return RequestSettings.of(
        route=route, logprobs=False, params={**GREEDY, **params}, request_params=request_params or {}
    )


def loglik(route: str = "completions", request_params: dict | None = None, **params: object) -> RequestSettings:
    return RequestSettings.of(route=route, logprobs=True, params=params, request_params=request_params or {})


@pytest.mark.parametrize(
    "other",
    [
        gen(temperature=0.7),
        gen(top_p=0.95),
        gen(max_new_tokens=64),
        gen(request_params={"top_k": 40}),
        gen(task="mmlu_str"),  # another harness task: its own stop sequences and max_gen_toks
        loglik(),  # echo, logprobs, max_tokens 1: Export-Deploy would apply them to the generations too
    ],
    ids=["temperature", "top_p", "max_new_tokens", "top_k", "harness task", "log-likelihood"],
)
def test_different_settings_never_share_a_group(other: RequestSettings):
    assert other != gen()
    assert task_groups([gen(), other, gen()]) == ((0, 2), (1,))


def test_identical_settings_share_one_group():
    assert task_groups([gen(), gen(), gen()]) == ((0, 1, 2),)
    # a repeat's seed differs per run and Export-Deploy never reads it (it is seeded once, at start-up)
    assert gen(request_params={"seed": 1}) == gen(request_params={"seed": 2}) == gen()
    # lm-eval sends every log-likelihood request with the same fixed settings, whatever the task's params
    assert loglik(temperature=0.5, task="hellaswag") == loglik(temperature=1e-07, task="arc_challenge")
    assert loglik(request_params={"top_k": 5}) != loglik()  # a field the config adds to every request


def test_chat_and_completions_queue_apart_so_they_share_a_group():
    """Export-Deploy batches each route in its own queue: one settings per route per group."""
    settings = [gen(), gen(temperature=0.7), gen("chat", task="ifeval"), gen("chat", task="mtbench"), loglik()]
    assert task_groups(settings) == ((0, 2), (1, 3), (4,))


def test_a_task_whose_settings_are_unknown_runs_alone():
    assert task_groups([gen(), None, gen()]) == ((0, 2), (1,))


def compiled(env: Path, *overrides: str, tasks: tuple[str, ...] = ()) -> CompiledConfig:
    request = CompileRequest(
        configs=("sft",),
        profile="CLUSTER",
        mode="run",
        tasks=tasks,
        overrides=("run.model=/lustre/ckpt", "export.wandb.enabled=false", *overrides),
        env_file=env,
    )
    return compile_config(request)


def plan_of(c: CompiledConfig) -> JobPlan:
    toolchain = Toolchain(python="python3", evaluator="nemo-evaluator")
    return build_plan(c, invocation="i", job_dir="/lustre/me/job", toolchain=toolchain, launcher="slurm")


PROFILE = """
[CLUSTER]
executor = "slurm"
host = "login.cluster.invalid"
account = "llm"
remote_job_dir = "/lustre/me/ckpteval"
container_image = "nvcr.io/nvidia/nemo:25.11"
gpus_per_node = 8
"""


@pytest.fixture
def env(write_env) -> Path:  # type: ignore[no-untyped-def]
    return write_env(PROFILE)


def test_the_plan_groups_a_real_config_by_its_tasks_settings(env: Path):
    """Two log-likelihood tasks together; gsm8k sampled (`:4`, temperature 0.7) and mmlu (greedy) apart."""
    c = compiled(env, tasks=("hellaswag", "gsm8k:4", "arc_challenge", "lm-evaluation-harness.mmlu"))
    plan = plan_of(c)
    assert [t.name for t in plan.tasks] == ["hellaswag", "gsm8k", "arc_challenge", "lm-evaluation-harness.mmlu"]
    assert plan.task_groups == ((0, 2), (1,), (3,))
    note = grouping_note(plan)
    assert note is not None
    lines = note.splitlines()
    assert "first one's sampling settings" in lines[0] and len(lines) == 4
    assert lines[1].strip() == "group 1 of 3: hellaswag, arc_challenge (log-likelihood (completions))"
    assert "group 2 of 3: gsm8k (generation of gsm8k (completions), temperature 0.7, top_p 0.95" in lines[2]
    assert (
        "group 3 of 3: lm-evaluation-harness.mmlu (generation of mmlu_str (completions), temperature 1e-07"
        in (lines[3])
    )


def test_one_task_set_to_the_others_settings_joins_them(env: Path):
    """The same harness task twice (two entries, one per few-shot count): one group when the settings agree."""
    zero_shot = "nemo_evaluator_config: {config: {params: {extra: {num_fewshot: 0}}}}"
    tasks = f"evaluation.tasks=[{{name: gsm8k}}, {{name: gsm8k, {zero_shot}}}]"
    assert plan_of(compiled(env, tasks)).task_groups == ()
    hot = tasks.replace("extra: {num_fewshot: 0}", "temperature: 0.5")
    assert plan_of(compiled(env, hot)).task_groups == ((0,), (1,))


def test_releases_that_run_each_request_alone_keep_every_task_at_once(env: Path):
    c = compiled(env, tasks=("hellaswag", "gsm8k"))
    plan = plan_of(c)
    deployment = c.config.deployment
    assert isinstance(deployment, MegatronDeployment)
    assert plan.task_groups == ((0,), (1,))  # unprobed: the 0.5-0.6 layout, which batches
    # Export-Deploy 0.4's script: no --batch_wait_timeout_s, each request its own inference call
    v04 = dataclasses.replace(DEFAULT_ENTRY_POINT, flags=MLM_FLAGS - {"--batch_wait_timeout_s"}, source="probe")
    assert not batches_across_clients(deployment, v04)
    regrouped = with_entry_point(plan, c, v04)
    assert regrouped.task_groups == () and grouping_note(regrouped) is None
    assert with_entry_point(regrouped, c, DEFAULT_ENTRY_POINT).task_groups == ((0,), (1,))
    # max_batch_size 1: Serve's batches hold one request each
    one = compiled(env, "deployment.max_batch_size=1", tasks=("hellaswag", "gsm8k"))
    assert plan_of(one).task_groups == ()


def test_a_builtin_deployment_is_never_grouped(isolated_user: Path, tmp_path: Path):
    request = CompileRequest(configs=("tiny",), tasks=("hellaswag", "gsm8k"))
    toolchain = Toolchain(python="python3", evaluator="nemo-evaluator")
    c = compile_config(request)
    plan = build_plan(c, invocation="i", job_dir=str(tmp_path), toolchain=toolchain, launcher="local")
    assert plan.deployment.kind == "megatron/builtin" and plan.task_groups == ()
    assert all(t.settings is not None for t in plan.tasks)
