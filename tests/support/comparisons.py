"""Recorded invocations whose tasks carry given per-sample scores (results.json, tasks/<t>/samples.jsonl and
the invocation record), for `evaluate compare` and `evaluate report`."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from ckpteval.invocation.record import InvocationRecord, TaskEntry
from ckpteval.results.model import InvocationResults, Metric, TaskOutcome
from ckpteval.results.samples import SAMPLES_FILE, SampleScore, write_samples
from ckpteval.results.store import write_results


def doc_hash(task: str, i: int) -> str:
    return hashlib.sha256(f"{task} document {i}".encode()).hexdigest()


def sample_rows(task: str, scores: Mapping[str, Sequence[float]], *, first_doc: int = 0) -> list[SampleScore]:
    """One row per document: metric -> its scores in document order (documents first_doc, first_doc+1, ...)."""
    n = len(next(iter(scores.values())))
    return [
        SampleScore(task, first_doc + i, doc_hash(task, first_doc + i), {m: float(v[i]) for m, v in scores.items()})
        for i in range(n)
    ]


def record_invocation(
    root: Path,
    invocation: str,
    tasks: Mapping[str, list[SampleScore]],
    *,
    label: str | None = None,
    settings: Mapping[str, Mapping[str, object]] | None = None,
    served: Mapping[str, object] | None = None,
    job_yaml: Mapping[str, object] | None = None,
    files: Mapping[str, str] | None = None,
) -> InvocationResults:
    """A finished local invocation under `root/<invocation>` with these per-sample scores (metric values are
    their means, stderr their standard error of the mean). With `settings` (task -> the harness's request
    params), each task's harness output records them and results.json has the provenance read from it. With
    `served` (job.yaml's `deployment`, e.g. {"kind": "megatron/builtin", "identity": "tok"}), the job also
    recorded its deployment and, with an `identity`, verified the endpoint's (a run without caveats);
    `job_yaml` adds to job.yaml (e.g. `origin`), `files` are more files of the job directory (path -> text)."""
    job_dir = root / invocation
    outcomes = {}
    for task, rows in tasks.items():
        metrics = {}
        for metric in dict.fromkeys(m for r in rows for m in r.scores):
            values = [r.scores[metric] for r in rows]
            mean = sum(values) / len(values)
            sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
            metrics[metric] = Metric(value=mean, stderr=sd / math.sqrt(len(values)), n_samples=len(values))
        outcomes[task] = TaskOutcome(
            name=task, status="succeeded", harness="lm-evaluation-harness", metrics=metrics, n_samples=len(rows)
        )
        (job_dir / "tasks" / task).mkdir(parents=True, exist_ok=True)
        write_samples(job_dir / "tasks" / task / SAMPLES_FILE, rows)
    provenance = None
    if settings is not None or served is not None:
        import yaml

        from ckpteval.invocation.jobdir import JobDir
        from ckpteval.results.provenance import read_provenance

        if served is not None:
            deployment = {k: v for k, v in served.items() if k != "identity"}
            (job_dir / JobDir.PROVENANCE).write_text(yaml.safe_dump({"deployment": deployment, **(job_yaml or {})}))
            for rel, text in (files or {}).items():
                (job_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                (job_dir / rel).write_text(text)
            if served.get("identity"):
                (job_dir / JobDir.DEPLOYMENT_IDENTITY).parent.mkdir(parents=True, exist_ok=True)
                (job_dir / JobDir.DEPLOYMENT_IDENTITY).write_text(f"{served['identity']}\n")
        for task, params in (settings or {}).items():
            output = job_dir / "tasks" / task / "output"
            output.mkdir(parents=True, exist_ok=True)
            (output / "results.yml").write_text(yaml.safe_dump({"config": {"type": task, "params": dict(params)}}))
        provenance = read_provenance(job_dir, [(t, f"tasks/{t}") for t in tasks])
    results = InvocationResults(
        invocation=invocation,
        created="2026-11-24T10:00:00Z",
        status="succeeded",
        label=label,
        tasks=outcomes,
        provenance=provenance,
    )
    write_results(job_dir, results)
    InvocationRecord(
        id=invocation,
        created=results.created,
        mode="local",
        profile="local",
        executor="local",
        job_dir=str(job_dir),
        tasks=[TaskEntry(name=t, dir=f"tasks/{t}") for t in tasks],
        local_results_dir=str(job_dir),
    ).save()
    return results
