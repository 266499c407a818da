"""`python -m ckpteval.deploy`, the entry point's name in job scripts written before the server moved to
`ckpteval.server`: a resumed invocation runs such a script as it was written, so the old name still serves."""

from __future__ import annotations

import subprocess
import sys


def test_the_old_entry_point_runs_the_server_commands() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ckpteval.deploy", "serve", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "--checkpoint" in result.stdout and "--served-model-name" in result.stdout


def test_the_old_entry_point_fails_cleanly() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ckpteval.deploy", "prepare", "llama"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "invalid choice: 'llama'" in result.stderr
