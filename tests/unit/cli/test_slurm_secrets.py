"""A secret value never goes into a Slurm job's files: the invocation is refused before anything is contacted."""

from __future__ import annotations

import os
from pathlib import Path

from typer.testing import CliRunner

from ckpteval.cli.main import app

PROFILE = """
[CLUSTER]
executor = "slurm"
host = "login.cluster.invalid"
account = "llm"
remote_job_dir = "/lustre/me/ckpteval"
"""


def test_a_secret_in_the_jobs_environment_is_refused_before_connecting(isolated_user: Path, write_env, monkeypatch):
    write_env(PROFILE)
    monkeypatch.setenv("MY_HUB_TOKEN", "hf_supersecretvalue123")
    result = CliRunner().invoke(
        app, ["-c", "tiny", "--batch", "CLUSTER", "+execution.env_vars.HF_TOKEN=${secret:MY_HUB_TOKEN}"]
    )
    assert result.exit_code == 2, result.output
    assert "A secret value (a key or token) would be written into job.sh on the cluster." in result.output
    assert "hf_supersecretvalue123" not in result.output  # and the preview redacted it
    assert "Cannot resolve host" not in result.output  # refused before connecting
    assert not (Path(os.environ["XDG_STATE_HOME"]) / "ckpteval").exists()
