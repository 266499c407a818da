"""Per-task data status (the dry run's column), the refusal message, and the job steps that read staged data."""

from __future__ import annotations

import pytest

from ckpteval.cluster.submission import with_staged_data
from ckpteval.errors import ConfigError
from ckpteval.job.plan import DeploymentPlan, JobPlan, Step, TaskPlan, TaskRun
from ckpteval.tasks.catalog import load_catalog
from ckpteval.tasks.data_status import data_statuses, refuse_missing, render_statuses
from ckpteval.tasks.datasets import DatasetRef

PIQA = DatasetRef("baber/piqa", None, None, ("train", "validation"))


def specs(*names: str):  # type: ignore[no-untyped-def]
    catalog = load_catalog()
    return [catalog.get(n) for n in names]


def test_statuses_per_task_and_one_refusal_naming_task_dataset_and_commands() -> None:
    tasks = specs("piqa", "adlr_arc_challenge_llama_25_shot", "adlr_mmlu", "simpleqa")
    here = {PIQA}
    dry = {s.task: s.status for s in data_statuses(tasks, cached_here=here.__contains__, staged_there=None)}
    assert dry == {
        "piqa": "unchecked",
        "adlr_arc_challenge_llama_25_shot": "missing",
        "adlr_mmlu": "packaged offline data",
        "simpleqa": "own data",
    }
    checked = data_statuses(tasks, cached_here=here.__contains__, staged_there=lambda ref: False)
    assert [s.status for s in checked][:2] == ["to push", "missing"]
    staged = data_statuses(tasks[:1], cached_here=lambda ref: False, staged_there=lambda ref: True)
    assert staged[0].status == "staged" and staged[0].staged
    with pytest.raises(ConfigError) as refused:
        refuse_missing(checked, profile="CL", where="me@login:22")
    assert refused.value.message == (
        "Profile [CL] has compute_internet = false and these tasks' datasets are not staged on me@login:22 "
        "nor fetched here: adlr_arc_challenge_llama_25_shot: allenai/ai2_arc:ARC-Challenge."
    )
    assert refused.value.hint == (
        "Stage them with: evaluate data fetch -t adlr_arc_challenge_llama_25_shot && evaluate data push CL"
    )
    table = render_statuses(checked)
    assert "to push" in table.splitlines()[0] and "baber/piqa" in table.splitlines()[0]
    own = table.splitlines()[3]
    assert own.startswith("simpleqa") and "own data" in own
    assert "unchecked: this harness downloads its own data; on a cluster whose nodes are offline" in own


def test_task_steps_mount_the_staged_cache_read_only_with_the_hub_off() -> None:
    def task(name: str) -> TaskPlan:
        step = Step(command="nemo-evaluator run_eval", env={"A": "1"}, image="/c/lm-eval.sqsh", mounts=("/j:/j",))
        return TaskPlan(name=name, dir_name=name, runs=(TaskRun(run_config={}, step=step),), endpoint_url="u")

    plan = JobPlan(
        invocation="i",
        job_dir="/r/evaluations/i",
        deployment=DeploymentPlan(kind="none", step=None, health_url=None, readiness_timeout=1),
        tasks=(task("piqa"), task("adlr_mmlu")),
    )
    out = with_staged_data(plan, "/r/datasets", {"piqa"})
    staged, packaged = (t.runs[0].step for t in out.tasks)
    assert staged.mounts == ("/j:/j", "/r/datasets:/r/datasets:ro") == packaged.mounts
    assert staged.env == {
        "A": "1",
        "HF_HOME": "/r/datasets",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "CKPTEVAL_OFFLINE_DATA": "off",
        "HF_DATASETS_CACHE": "/r/evaluations/i/tasks/piqa/hf-datasets",
    }
    assert staged.command.startswith("mkdir -p /r/evaluations/i/tasks/piqa/hf-datasets && ")
    assert "cp -rsf /r/datasets/datasets/. /r/evaluations/i/tasks/piqa/hf-datasets/" in staged.command
    assert staged.command.endswith("nemo-evaluator run_eval")
    assert packaged.env == {"A": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    assert packaged.command == "nemo-evaluator run_eval"
