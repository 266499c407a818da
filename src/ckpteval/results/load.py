"""Find a recorded invocation's results and per-sample scores, wherever it ran (for compare and report)."""

from __future__ import annotations

from pathlib import Path

from ckpteval.results.compare import InvocationSamples


def invocation_samples(invocation: str) -> InvocationSamples:
    """The results and per-sample scores of a recorded invocation (an id or a prefix). A Slurm
    invocation's files are fetched from the cluster first, as `evaluate results` does."""
    from ckpteval.job import manage
    from ckpteval.job.invocation import load_record

    record = load_record(invocation)
    results = manage.results(record)
    if record.executor == "slurm":
        from ckpteval.cluster.manage import local_job_copy

        job_dir = Path(record.local_results_dir) if record.local_results_dir else local_job_copy(record)
    else:
        job_dir = Path(record.job_dir)
    return InvocationSamples.load(job_dir, results, dict(manage._task_dirs(record)))
