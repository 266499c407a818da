"""The sbatch request of an invocation: what --dry-run shows (golden), and that it is what nemo-run submits."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ckpteval.cluster.sbatch import (
    SbatchSpec,
    executor_settings,
    extra_sbatch_flags,
    render_sbatch_preview,
    tunnel_dir_for,
)
from ckpteval.errors import ConfigError

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("CKPTEVAL_UPDATE_GOLDEN") == "1"


def spec(**overrides) -> SbatchSpec:  # type: ignore[no-untyped-def]
    values = dict(
        invocation="1a2b3c4d",
        job_script="/lustre/me/ckpteval/evaluations/1a2b3c4d/job.sh",
        tunnel_dir=tunnel_dir_for("/lustre/me/ckpteval"),
        account="llm",
        partition="batch",
        nodes=2,
        gpus_per_node=8,
        time="04:00:00",
        extra_flags={"exclusive": True, "qos": "high priority", "mem": 0, "requeue": False},
    )
    values.update(overrides)
    return SbatchSpec(**values)  # type: ignore[arg-type]


def test_preview_golden():
    text = render_sbatch_preview(spec())
    golden = GOLDEN / "sbatch_preview.sh"
    if UPDATE:
        golden.write_text(text)
    assert text == golden.read_text()


def test_cpu_only_job_asks_for_no_gpus_and_no_account_means_the_default():
    text = render_sbatch_preview(spec(gpus_per_node=0, account=None, extra_flags={}))
    assert "--gres" not in text and "--account" not in text


def test_flags_ckpteval_sets_itself_or_that_are_not_scalars_are_refused():
    with pytest.raises(ConfigError, match="set by ckpteval itself"):
        extra_sbatch_flags({"job-name": "x"})
    with pytest.raises(ConfigError, match="not a string, number or true"):
        extra_sbatch_flags({"dependency": ["afterok:1"]})
    assert extra_sbatch_flags({"--gpus-per-task": 1, "exclusive": False}) == {"gpus_per_task": 1}


def test_remote_job_dir_with_nemo_run_component_is_refused():
    with pytest.raises(ConfigError, match="/nemo_run"):
        tunnel_dir_for("/lustre/me/nemo_run/evals")
    assert tunnel_dir_for("/lustre/me/ckpteval/") == "/lustre/me/ckpteval/nemo-run"


def test_preview_is_what_nemo_run_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Materialize nemo-run's own sbatch script from our executor settings (no submission) and compare."""
    from ckpteval.cluster.nemorun import import_nemo_run

    monkeypatch.setenv("CKPTEVAL_STATE_DIR", str(tmp_path))
    run = import_nemo_run()
    from nemo_run.core.execution.slurm import SlurmBatchRequest
    from nemo_run.core.tunnel.client import SSHTunnel

    s = spec()
    executor = run.SlurmExecutor(
        **executor_settings(s),
        tunnel=SSHTunnel(host="login", user="me", job_dir=s.tunnel_dir),
        packager=run.Packager(),
    )
    experiment = "ckpteval_1700000000"
    executor.assign(experiment, str(tmp_path / experiment), s.invocation, s.invocation)
    executor.tunnel.job_dir = f"{s.tunnel_dir}/ckpteval/{experiment}"  # what the experiment sets on the tunnel
    request = SlurmBatchRequest(
        launch_cmd=["sbatch", "--requeue", "--parsable"],
        jobs=[s.invocation],
        command_groups=[[f"bash {s.job_script}"]],
        executor=executor,
        max_retries=0,
        extra_env={},
    )
    theirs = request.materialize()
    ours = render_sbatch_preview(s).replace("<experiment>", experiment)
    flags = lambda text: [ln.replace("'", "") for ln in text.splitlines() if ln.startswith("#SBATCH")]  # noqa: E731
    assert flags(ours) == flags(theirs)
    step = lambda text: re.search(r"^srun --output .*$", text, re.M).group(0)  # type: ignore[union-attr]  # noqa: E731
    assert step(ours) == step(theirs)
