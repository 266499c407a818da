"""Judge-scored tasks: the catalog says which tasks need a judge, a judged task without one is refused
before anything is written, the harness is told the configured judge (the user's own values win), and the
judge's key reaches the task only through an owner-only file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.errors import ConfigError
from ckpteval.job.build import JUDGE_API_KEY_ENV, Toolchain, build_plan, judge_key_file
from ckpteval.tasks.catalog import load_catalog
from ckpteval.tasks.harness_hook.ckpteval_judge import JUDGE_ERRORS_FILE, JudgeFailures, check_judgments

TOOLCHAIN = Toolchain(python="python3", evaluator="nemo-evaluator", hook_dir="/hook")


@pytest.mark.parametrize(
    ("task", "judge"),
    [
        ("mtbench", "needs"),
        ("mtbench-cor1", "needs"),
        ("AIME_2025", "needs"),  # simple-evals grades AIME with a judge (its equality checker) ...
        ("aime_2025_nemo", ""),  # ... and its _nemo variant with sympy only
        ("simpleqa", "needs"),
        ("simple_evals.mmlu", ""),  # simple-evals gives every task a judge section; mmlu never calls it
        ("ns_aime2025", "needs"),  # NeMo-Skills: judge_support true
        ("ns_gpqa", ""),  # judge_support false
        ("ns_arena_hard_v2", "needs"),
        ("tau2_bench_airline", "can use"),  # extra.judge.enabled false
        ("adlr_mmlu", ""),
        ("gsm8k", ""),
    ],
)
def test_the_catalog_says_which_tasks_need_a_judge(task: str, judge: str) -> None:
    import ckpteval

    [info] = [t for t in ckpteval.tasks() if task in (t.name, t.qualified_name) and (t.name == task or "." in task)]
    assert info.judge == judge
    assert load_catalog().get(task).needs_judge == (judge == "needs")


def test_each_harness_reads_the_key_variable_under_its_own_key() -> None:
    catalog = load_catalog()
    assert catalog.get("mtbench").judge.api_key_key == "api_key_name"
    assert catalog.get("AIME_2025").judge.api_key_key == "api_key"
    assert catalog.get("tau2_bench_airline").judge.route == "/chat/completions"


def test_a_judged_task_without_a_judge_is_refused_in_one_line(isolated_user: Path) -> None:
    with pytest.raises(ConfigError) as err:
        compile_config(CompileRequest(configs=("tiny",), tasks=("mtbench",), cwd=isolated_user))
    message = str(err.value)
    assert "mtbench is scored by a judge model and no judge is set" in message
    assert "judge=api judge.url=URL judge.model_id=MODEL" in message and "\n" not in message


def _plan(tmp_path: Path, *overrides: str, tasks: tuple[str, ...] = ("mtbench",)):
    compiled = compile_config(CompileRequest(configs=("tiny",), tasks=tasks, overrides=overrides, cwd=tmp_path))
    return compiled, build_plan(
        compiled, invocation="i", job_dir=str(tmp_path / "job"), toolchain=TOOLCHAIN, launcher="processes"
    )


def test_an_api_judge_is_what_the_harness_is_told(
    isolated_user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_JUDGE_KEY", "s3cret-judge-key")
    judge = ("judge=api", "judge.url=https://judge.example/v1", "judge.model_id=judge-70b")
    _, plan = _plan(tmp_path, *judge, "judge.api_key_name=MY_JUDGE_KEY")
    [run] = plan.tasks[0].runs
    told = run.run_config["config"]["params"]["extra"]["judge"]
    # MT-Bench's default judge (gpt-4 at OpenAI) is replaced; the key travels as a variable's NAME
    assert (told["url"], told["model_id"], told["api_key_name"]) == (
        "https://judge.example/v1",
        "judge-70b",
        JUDGE_API_KEY_ENV,
    )
    # the task reads the key from the owner-only file at run time; the key itself is nowhere in the plan
    assert f'{JUDGE_API_KEY_ENV}="$(cat {judge_key_file(str(tmp_path / "job"))})"' in run.step.command
    # and checks, before the harness sends the judge anything, that it serves the model named
    assert "ckpteval_judge.py check https://judge.example/v1 judge-70b CKPTEVAL_JUDGE_API_KEY && " in run.step.command
    assert "s3cret-judge-key" not in json.dumps(run.run_config) + run.step.command
    # the user's own values win over the judge's
    mine = "+evaluation.nemo_evaluator_config.config.params.extra.judge.model_id=my-judge-name"
    _, plan = _plan(tmp_path, *judge, mine)
    assert plan.tasks[0].runs[0].run_config["config"]["params"]["extra"]["judge"]["model_id"] == "my-judge-name"
    # a task that uses no judge is left as it is
    _, plan = _plan(tmp_path, *judge, tasks=("gsm8k",))
    assert "judge" not in plan.tasks[0].runs[0].run_config["config"]["params"]["extra"]


def test_an_api_judge_whose_key_is_not_set_is_refused(isolated_user: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"\$NO_SUCH_JUDGE_KEY is not set here"):
        compile_config(
            CompileRequest(
                configs=("tiny",),
                tasks=("mtbench",),
                overrides=(
                    "judge=api",
                    "judge.url=http://j/v1",
                    "judge.model_id=j",
                    "judge.api_key_name=NO_SUCH_JUDGE_KEY",
                ),
                cwd=isolated_user,
            )
        )


def test_the_model_judges_itself_only_when_asked_on_the_port_it_published(isolated_user: Path, tmp_path: Path) -> None:
    compiled, plan = _plan(tmp_path, "judge=self")
    [run] = plan.tasks[0].runs
    assert (
        run.run_config["config"]["params"]["extra"]["judge"]["model_id"] == compiled.config.target.api_endpoint.model_id
    )
    assert '--overrides "config.params.extra.judge.url=http://127.0.0.1:${DEPLOY_PORT}/v1"' in run.step.command


def test_the_judge_key_is_staged_owner_only_and_redacted(
    isolated_user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpteval.cluster.remote import LocalRemote
    from ckpteval.execution.pipeline import stage_judge_key
    from ckpteval.execution.planned import PlannedJob

    monkeypatch.setenv("MY_JUDGE_KEY", "s3cret-judge-key")
    compiled, plan = _plan(
        tmp_path, "judge=api", "judge.url=http://j/v1", "judge.model_id=j", "judge.api_key_name=MY_JUDGE_KEY"
    )
    job = PlannedJob(compiled=compiled, invocation="i", job_dir=str(tmp_path / "job"), plan=plan, images=[])
    stage_judge_key(job, LocalRemote())
    key_file = Path(judge_key_file(str(tmp_path / "job")))
    assert key_file.read_text() == "s3cret-judge-key\n"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert "s3cret" not in compiled.secrets.redact("key s3cret-judge-key")


def _judgment(score: int, text: str) -> dict:
    return {"question_id": 81, "turn": 1, "score": score, "judgment": text}


def test_judge_failures_are_counted_and_past_the_threshold_fail_the_task() -> None:
    rows = [_judgment(7, "Rating: [[7]]")] * 3 + [_judgment(-1, "I cannot decide.")]
    assert check_judgments(rows, max_error_rate=0.5) == (1, 4)
    with pytest.raises(JudgeFailures, match=r"judge errors 1 of 4") as err:
        check_judgments(rows, max_error_rate=0.05)
    assert "I cannot decide." in str(err.value)  # the judge's last replies, in the task's log


def test_mtbench_result_of_a_named_judge_is_read_with_its_judge_errors(tmp_path: Path, monkeypatch) -> None:
    """nvidia-mtbench-evaluator 26.3 writes `<judge>-result.json` for any judge but gpt-4 and then looks for
    `result.json`: the hook reads the judge's own, and adds the judge errors beside the score."""
    output = pytest.importorskip("core_evals.mtbench.output")  # the `judge` extra
    from ckpteval.tasks.harness_hook.ckpteval_judge import patch_mtbench_output

    run = tmp_path / "mtbench" / "model" / "first_1"
    (run / "judgements").mkdir(parents=True)
    rows = [_judgment(8, "[[8]]"), _judgment(-1, "no idea"), _judgment(6, "[[6]]"), _judgment(7, "[[7]]")]
    (run / "judgements" / "judge-x_single.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"total": 7.0, "category": {"writing": 7.0}, "num_missing": 1, "judge": "judge-x", "task": "mtbench"}
    (run / "judge-x-result.json").write_text(json.dumps(summary))
    with pytest.raises(FileNotFoundError):
        output.parse_output(str(tmp_path))  # the harness's own parser: no score at all
    module = type(output)("patched_output")
    module.parse_output = output.parse_output
    patch_mtbench_output(module)
    monkeypatch.setenv("CKPTEVAL_JUDGE_MAX_ERROR_RATE", "0.5")
    result = module.parse_output(str(tmp_path))
    scores = result.groups["mtbench:judge-x"].metrics["average_score"].scores
    assert scores["average_score"].value == 7.0
    # the judge errors, beside the harness output (the results, table, status and exports read them there)
    assert json.loads((tmp_path / JUDGE_ERRORS_FILE).read_text()) == {
        "errors": 1,
        "judgments": 4,
        "max_error_rate": 0.5,
    }
    # ckpteval reads the score from results.yml as nemo-evaluator writes it
    import yaml

    from ckpteval.tasks.results import read_task_result

    results_yml = {"config": {"type": "mtbench"}, "results": result.model_dump(exclude_none=True)}
    # the run config nemo-evaluator writes when the task starts (its harness: not lm-eval), then its results
    (tmp_path / "run_config.yml").write_text(yaml.dump({"framework_name": "mtbench", "config": {"type": "mtbench"}}))
    os.utime(tmp_path / "run_config.yml", (1_000_000_000, 1_000_000_000))
    (tmp_path / "results.yml").write_text(yaml.dump(results_yml))
    read = read_task_result(tmp_path)
    assert read.harness_task == "mtbench:judge-x"
    assert {k: m.value for k, m in read.metrics.items()} == {"average_score": 7.0, "num_missing": 1.0}
    assert read.subtasks["writing"]["average_score"].value == 7.0
    monkeypatch.setenv("CKPTEVAL_JUDGE_MAX_ERROR_RATE", "0.05")
    with pytest.raises(JudgeFailures, match="judge errors 1 of 4"):
        module.parse_output(str(tmp_path))
    # counted before the task failed: its results say why it has no score
    assert json.loads((tmp_path / JUDGE_ERRORS_FILE).read_text())["errors"] == 1


def _judged_results(invocation: str, judge: dict | None, errors: int = 1):
    from ckpteval.results.model import InvocationResults, JudgeErrors, Metric, TaskOutcome
    from ckpteval.results.provenance import Provenance

    outcome = TaskOutcome(
        name="mtbench",
        status="succeeded",
        metrics={"average_score": Metric(7.0)},
        judge_errors=JudgeErrors(errors=errors, judgments=80),
    )
    return InvocationResults(
        invocation=invocation,
        created="2026-11-28T00:00:00Z",
        status="succeeded",
        tasks={"mtbench": outcome},
        provenance=Provenance(judge=judge),
    )


API_JUDGE = {"role": "judge", "kind": "api", "model_id": "judge-70b", "url": "http://j/v1", "tasks": ["mtbench"]}


def test_the_table_names_the_judge_and_its_errors_and_compare_warns_of_another_judge() -> None:
    from ckpteval.results.provenance import provenance_differences
    from ckpteval.results.table import render_text

    text = render_text([_judged_results("aaaa", API_JUDGE, errors=3)])
    assert "mtbench: judged by api judge-70b http://j/v1; judge errors 3 of 80" in text
    assert "| judge errors  | 3 of 80" in text  # a row under the score
    other = {**API_JUDGE, "model_id": "judge-8b"}
    a, b = _judged_results("aaaa", API_JUDGE), _judged_results("bbbb", other)
    assert provenance_differences(a.provenance, b.provenance, ["mtbench"]) == [
        "judged by different judges (api judge-70b http://j/v1 vs api judge-8b http://j/v1)"
    ]
    assert provenance_differences(a.provenance, a.provenance, ["mtbench"]) == []


def test_the_judge_is_checked_before_its_first_request() -> None:
    from ckpteval.tasks.harness_hook.ckpteval_judge import judge_identity_problem
    from tests.support.judge_standin import JudgeStandIn

    judge = JudgeStandIn(model_id="judge-70b", api_key="k").start()
    try:
        assert judge_identity_problem(judge.url, "judge-70b", "k") is None
        assert "does not serve judge-8b (it lists: judge-70b)" in (
            judge_identity_problem(judge.url, "judge-8b", "k") or ""
        )
        assert "answered 401" in (judge_identity_problem(judge.url, "judge-70b", "wrong") or "")
    finally:
        judge.stop()
    assert judge.requests == []  # only GET /models: no judging request was sent
    assert "did not answer" in (judge_identity_problem(judge.url, "judge-70b", "k", timeout=2) or "")


def test_results_json_records_the_judge(tmp_path: Path) -> None:
    import yaml

    from ckpteval.results.provenance import read_provenance

    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"judge": API_JUDGE}))
    run_config = {"config": {"params": {"extra": {"judge": {"url": "http://j/v1", "temperature": 0.0}}}}}
    (tmp_path / "tasks" / "mtbench").mkdir(parents=True)
    (tmp_path / "tasks" / "mtbench" / "run_config.yml").write_text(yaml.safe_dump(run_config))
    judge = read_provenance(tmp_path, [("mtbench", "tasks/mtbench")]).judge
    assert judge is not None
    assert (judge["role"], judge["kind"], judge["model_id"], judge["url"]) == (
        "judge",
        "api",
        "judge-70b",
        "http://j/v1",
    )
    assert judge["verified"] is True and judge["settings"] == {"mtbench": {"temperature": 0.0}}
