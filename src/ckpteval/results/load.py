"""Find a recorded invocation's results and per-sample scores, wherever it ran (for compare and report)."""

from __future__ import annotations

from pathlib import Path

from ckpteval.results.compare import InvocationSamples


def invocation_samples(invocation: str) -> InvocationSamples:
    """The results and per-sample scores of a recorded invocation (an id or a prefix). A Slurm
    invocation's files are fetched from the cluster first, as `evaluate results` does."""
    from ckpteval.api import results
    from ckpteval.invocation.record import load_record

    record = load_record(invocation)
    found = results(record)  # a cluster invocation's files are fetched here, into local_results_dir
    job_dir = Path(record.local_results_dir or record.job_dir)
    return InvocationSamples.load(job_dir, found, dict(record.task_dirs))
