"""The kept Slurm job of `evaluate watch` (execution/slurm_kept.py), its pure parts: when a Slurm profile keeps one
job (and why not), its sbatch script, and how its sacct record splits into the invocations' steps. The kept job
itself, on the real test cluster: tests/integration/test_watch_slurm_kept.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ckpteval.cluster.sbatch import SbatchSpec
from ckpteval.cluster.slurm import parse_sacct_allocation
from ckpteval.execution.slurm_kept import kept_job_name, kept_steps, render_kept_script
from ckpteval.watch.kept import keep_decision
from ckpteval.watch.state import WatchSpec
from tests.unit.watch.test_kept import _compiled


def test_a_slurm_profile_keeps_one_job_unless_the_deployments_need_more(tmp_path: Path, isolated_user: Path) -> None:
    iter_dir = tmp_path / "run" / "iter_0000001"
    iter_dir.mkdir(parents=True)
    (tmp_path / "run" / "tokenizer").mkdir()
    spec = WatchSpec(save_dir=str(iter_dir.parent), configs=["tiny"], profile=None, tasks=["hellaswag"], overrides=[])
    one = dataclasses.replace(spec, max_pending=1)
    config = _compiled(iter_dir).config
    kept = keep_decision(one, config, here=False, in_kept_job=True)
    assert kept.keep and "in one kept Slurm job, each checkpoint a step of it" in kept.line
    # a cluster whose executor keeps no job: one job per checkpoint, as before
    assert not keep_decision(one, config, here=False).keep
    side_by_side = keep_decision(dataclasses.replace(spec, max_pending=4), config, here=False, in_kept_job=True)
    assert not side_by_side.keep and "--max-pending 4" in side_by_side.line


def test_the_kept_job_script_is_the_server_with_the_evaluations_request() -> None:
    spec = SbatchSpec(
        invocation="kept-run42",
        job_script="/lustre/x/job.sh",
        tunnel_dir="/lustre/x/nemo-run",
        account="acct",
        partition="batch",
        nodes=2,  # the kept job takes one node whatever the evaluation's request
        gpus_per_node=8,
        time="04:00:00",
        extra_flags={"qos": "high"},
    )
    script = render_kept_script(
        "/lustre/x/watch-kept/run42/link-1",
        spec,
        ["/venv/bin/python", "-m", "ckpteval.server", "serve", "--port", "0"],
        {"HF_HUB_OFFLINE": "1"},
        "run42",
    )
    lines = script.splitlines()
    assert f"#SBATCH --job-name={kept_job_name('run42')}" in lines
    for flag in ("--nodes=1", "--time=04:00:00", "--gres=gpu:8", "--account=acct", "--partition=batch", "--qos=high"):
        assert f"#SBATCH {flag}" in lines
    assert "#SBATCH --output=/lustre/x/watch-kept/run42/link-1/kept-%j.out" in lines
    assert lines[-1] == "exec /venv/bin/python -m ckpteval.server serve --port 0"  # scancel's SIGTERM reaches it
    assert "umask 077" in lines and "export HF_HUB_OFFLINE=1" in lines


def test_the_kept_jobs_time_splits_into_its_invocations_steps() -> None:
    sacct = "\n".join(
        [
            "512|ckpteval-kept-run42|00:10:00",
            "512.batch|batch|00:10:00",
            "512.0|ckpteval-kept-run42-probe|00:00:31",  # the watcher's question: the kept job's own time
            "512.1|ckpteval-abc123|00:02:05",
            "512.2|python|00:01:59",  # a step the job script started (its deployment): inside its invocation's
            "512.4|ckpteval-def456|00:01:40",
        ]
    )
    assert kept_steps(sacct) == {"512.1": 125.0, "512.4": 100.0}
    step = parse_sacct_allocation("512.1|00:02:05|cpu=1,gres/gpu=8,mem=0,node=1|2026-11-29T05:00:00|COMPLETED")
    assert step is not None and step["elapsed_seconds"] == 125.0 and step["gpus"] == 8


def test_a_watcher_inside_a_slurm_job_keeps_none(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The cluster-hosted watcher (--detach) is a chain of Slurm jobs: a step it started in a kept job would end
    with its link (srun's client is the link's process), so it keeps none, as before."""
    from ckpteval.execution.slurm import SlurmBackend

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert SlurmBackend().kept_job_refusal() == ""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert "runs in a Slurm job of its own (--detach)" in SlurmBackend().kept_job_refusal()
