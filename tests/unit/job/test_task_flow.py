"""`-t NAME:K` flows one way: the catalog is taken once (compile), the count goes down into the compiled
task, its layouts into the plan's runs and the job files; nothing below turns runs back into a count."""

from __future__ import annotations

from pathlib import Path

import pytest

import ckpteval.config.compile as compile_module
from ckpteval.config.compile import CompileRequest, compile_config
from ckpteval.job.build import build_plan, local_toolchain
from ckpteval.job.files import job_files
from ckpteval.job.plan import Step, TaskPlan, TaskRun
from ckpteval.tasks import catalog as catalog_module
from ckpteval.tasks.catalog import load_catalog
from ckpteval.tasks.repeats import RunLayout, current_log, run_layouts


def no_second_catalog(*_a: object, **_k: object) -> None:
    raise AssertionError("the catalog was loaded again below compile_config")


def test_the_catalog_is_taken_once_and_the_count_goes_down_to_the_job_files(monkeypatch, tmp_path: Path):
    catalog = load_catalog()
    monkeypatch.setattr(catalog_module, "load_catalog", no_second_catalog)
    monkeypatch.setattr(compile_module, "load_catalog", no_second_catalog)
    compiled = compile_config(CompileRequest(configs=("tiny",), tasks=("gsm8k:3", "hellaswag")), catalog=catalog)
    gsm8k, hellaswag = compiled.tasks
    assert (gsm8k.repeats, hellaswag.repeats) == (3, 0)
    assert gsm8k.layouts == (RunLayout(0), RunLayout(1), RunLayout(2))
    assert hellaswag.layouts == (RunLayout(),)

    plan = build_plan(
        compiled, invocation="inv", job_dir=str(tmp_path / "inv"), toolchain=local_toolchain(), launcher="processes"
    )
    g, h = plan.tasks
    assert (g.repeats, g.layouts) == (3, gsm8k.layouts)
    assert (h.repeats, h.layouts) == (0, hellaswag.layouts)
    assert [r.run_config["config"]["output_dir"] for r in g.runs] == [
        f"{tmp_path}/inv/tasks/{g.dir_name}/output-rs{i}" for i in range(3)
    ]
    files = job_files(compiled, plan, launcher="processes")
    assert files[f"{g.dir}/repeats"] == "3\n"
    assert f"{h.dir}/repeats" not in files
    assert sorted(f for f in files if f.startswith(f"{g.dir}/run_config")) == [
        f"{g.dir}/run_config-rs{i}.yml" for i in range(3)
    ]


def test_a_plan_whose_runs_disagree_with_its_count_is_refused():
    step = Step(command="true")
    with pytest.raises(ValueError, match="do not match 2 repeats"):
        TaskPlan(name="t", dir_name="t", runs=(TaskRun(run_config={}, step=step),), endpoint_url="u", repeats=2)


def test_current_log_is_the_newest_started_run(tmp_path: Path):
    def started_in(task_dir: Path):
        return lambda rel: (task_dir / rel).exists()

    assert current_log(run_layouts(0), started_in(tmp_path)) == "client.log"
    assert current_log(run_layouts(3), started_in(tmp_path)) == "client-rs0.log"  # none started yet
    (tmp_path / "client-rs0.log").write_text("")
    (tmp_path / "client-rs1.log").write_text("")
    assert current_log(run_layouts(3), started_in(tmp_path)) == "client-rs1.log"
