"""What an export carries: metric names, the run config, and which files of a job dir are kept."""

from __future__ import annotations

import math
from pathlib import Path

from ckpteval.export.content import artifact_files, load_content, metric_values, run_config
from ckpteval.results.model import InvocationResults, Metric, TaskOutcome
from tests.support.jobdirs import compiled_config_yaml, make_job_dir, sample_results


def test_metrics_are_keyed_task_slash_metric_with_stderr_and_samples():
    assert metric_values(sample_results("inv1")) == {
        "adlr_mmlu/exact_match": 0.3125,
        "adlr_mmlu/exact_match_stderr": 0.0231,
        "adlr_mmlu/n_samples": 50.0,
        "hellaswag/acc": 0.41,
        "hellaswag/acc_stderr": 0.049,
        "hellaswag/acc_norm": 0.47,
        "hellaswag/acc_norm_stderr": 0.05,
        "hellaswag/n_samples": 100.0,
    }


def test_failed_tasks_and_non_numbers_are_not_metrics():
    results = InvocationResults(
        invocation="inv2",
        created="t",
        status="failed",
        tasks={
            "ok": TaskOutcome(
                name="ok",
                status="succeeded",
                metrics={"acc": Metric(value=math.nan, stderr=0.1), "f1": Metric(value=0.5, stderr=None)},
            ),
            "bad": TaskOutcome(name="bad", status="failed", metrics={"acc": Metric(value=0.9)}),
        },
    )
    assert metric_values(results) == {"ok/acc_stderr": 0.1, "ok/f1": 0.5}


def test_kept_files_are_results_config_provenance_and_harness_output_not_caches(tmp_path: Path):
    job = tmp_path / "inv3"
    make_job_dir(job, "inv3", config_yaml="run: {}\n")
    assert sorted(artifact_files(job)) == [
        "config.yaml",
        "job.yaml",
        "results.json",
        "tasks/adlr_mmlu/output/eval_factory_metrics.json",
        "tasks/adlr_mmlu/output/results.yml",
        "tasks/adlr_mmlu/output/samples_adlr_mmlu.jsonl",
        "tasks/adlr_mmlu/run_config.yml",
        "tasks/hellaswag/output/eval_factory_metrics.json",
        "tasks/hellaswag/output/results.yml",
        "tasks/hellaswag/output/samples_hellaswag.jsonl",
        "tasks/hellaswag/run_config.yml",
    ]


def test_a_task_gets_its_own_files_and_the_shared_ones(tmp_path: Path):
    job = tmp_path / "inv4"
    results = make_job_dir(job, "inv4", config_yaml=compiled_config_yaml())
    content = load_content(job, results, task_dirs={"adlr_mmlu": "tasks/adlr_mmlu", "hellaswag": "tasks/hellaswag"})
    one = content.for_task("hellaswag")
    assert list(one.results.tasks) == ["hellaswag"]
    assert sorted(one.files) == [
        "config.yaml",
        "job.yaml",
        "results.json",
        "tasks/hellaswag/output/eval_factory_metrics.json",
        "tasks/hellaswag/output/results.yml",
        "tasks/hellaswag/output/samples_hellaswag.jsonl",
        "tasks/hellaswag/run_config.yml",
    ]


def test_the_run_config_is_the_saved_config_plus_what_the_invocation_was(tmp_path: Path):
    job = tmp_path / "inv5"
    results = make_job_dir(job, "inv5", config_yaml=compiled_config_yaml(["run.name=smoke"]))
    config = run_config(load_content(job, results))
    assert config["run"]["name"] == "smoke"
    assert config["deployment"]["type"] == "megatron"
    assert config["ckpteval"]["invocation"] == "inv5"
    assert config["ckpteval"]["tasks"] == {"adlr_mmlu": "succeeded", "hellaswag": "succeeded"}


def test_a_repeated_task_exports_every_mode_as_in_results_json():
    modes = {
        "pass@1[avg-of-2]": {"em": Metric(0.5, 0.25, 4, std_dev=0.35)},
        "majority@2": {"em": Metric(0.25, None, 4)},
        "pass@2": {"em": Metric(0.75, None, 4)},
    }
    outcome = TaskOutcome(
        name="gsm8k", status="succeeded", metrics=dict(modes["pass@1[avg-of-2]"]), n_samples=4, repeats=2, modes=modes
    )
    results = InvocationResults(invocation="inv3", created="t", status="succeeded", tasks={"gsm8k": outcome})
    assert metric_values(results) == {
        "gsm8k/em": 0.5,
        "gsm8k/em_stderr": 0.25,
        "gsm8k/n_samples": 4.0,
        "gsm8k/pass@1[avg-of-2]/em": 0.5,
        "gsm8k/pass@1[avg-of-2]/em_stderr": 0.25,
        "gsm8k/pass@1[avg-of-2]/em_std_dev": 0.35,
        "gsm8k/majority@2/em": 0.25,
        "gsm8k/pass@2/em": 0.75,
    }
