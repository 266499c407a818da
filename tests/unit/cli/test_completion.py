"""Shell completion: `evaluate --install-completion` writes a script bash sources, and completing asks the
real CLI for commands, config names, env.toml profiles, task names (after a comma too) and invocation ids."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.invocation.record import InvocationRecord, TaskEntry

ENV_TOML = """
[my-cluster]
host = "login.example.com"
account = "acct"
remote_job_dir = "/lustre/me"

[my-cluster-debug]
extends = "my-cluster"
partition = "debug"
"""


def _complete(line: str) -> list[str]:
    """What bash's completion asks of `evaluate`, for the last (incomplete) word of `line`."""
    words = line.split(" ")
    result = CliRunner().invoke(
        app,
        [],
        prog_name="evaluate",
        env={"_EVALUATE_COMPLETE": "complete_bash", "COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)},
    )
    assert result.exit_code == 0, result.output
    return result.output.split()


def test_commands(isolated_user):
    assert _complete("evaluate sta") == ["status"]
    listed = _complete("evaluate ")
    assert {"status", "tasks", "compare", "cancel", "resume"} <= set(listed)
    assert "run" not in listed  # the default action has no word
    assert _complete("evaluate --install") == ["--install-completion"]


def test_configs_and_profiles(isolated_user):
    (isolated_user / "env.toml").write_text(ENV_TOML)
    assert _complete("evaluate -c ti") == ["tiny"]
    assert _complete("evaluate -c tiny --run my-") == ["my-cluster", "my-cluster-debug"]
    assert _complete("evaluate -c tiny --batch lo") == ["local"]


def test_task_names_and_the_next_after_a_comma(isolated_user):
    assert "hellaswag" in _complete("evaluate -c tiny -t hellas")
    after_comma = _complete("evaluate -c tiny -t adlr_mmlu,hellas")
    assert "adlr_mmlu,hellaswag" in after_comma and all(w.startswith("adlr_mmlu,hellas") for w in after_comma)


def test_invocation_ids(isolated_user):
    for invocation in ("abcd0001", "abef0002", "ffff0003"):
        InvocationRecord(
            id=invocation,
            created="2026-11-24T10:00:00Z",
            mode="local",
            profile="local",
            executor="local",
            job_dir=f"/nowhere/{invocation}",
            tasks=[TaskEntry("hellaswag", "tasks/hellaswag")],
        ).save()
    assert sorted(_complete("evaluate status ab")) == ["abcd0001", "abef0002"]
    assert _complete("evaluate cancel ff") == ["ffff0003"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_install_completion_writes_a_script_bash_completes_with(isolated_user, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    # the shell named, not detected: typer finds the user's shell among this process's parents, and a test run
    # from a detached job (nohup, CI) has none ("Shell None is not supported")
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = CliRunner().invoke(
        app, ["--install-completion", "bash"], prog_name="evaluate", env={"HOME": str(home), "SHELL": "/bin/bash"}
    )
    assert result.exit_code == 0, result.output
    script = home / ".bash_completions" / "evaluate.sh"
    assert script.is_file() and str(script) in (home / ".bashrc").read_text()
    # bash sources the script and runs its completion function, which asks the real console script
    bin_dir = Path(sys.executable).parent
    probe = f"source {script}; COMP_WORDS=(evaluate sta); COMP_CWORD=1; _evaluate_completion evaluate; "
    probe += 'echo "${COMPREPLY[@]}"'
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(home)}
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["status"]
