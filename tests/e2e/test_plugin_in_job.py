"""An installed plugin package is found inside a job, not only by the CLI: the toy plugin of
tests/unit/test_registry_plugins.py, installed with its entry points, gives an executor whose jobs export their
results themselves (as a Slurm job does). `evaluate --run` with it runs a real job on this machine (its own process
group, `bash job.sh`); the job's export step (`python -m ckpteval.export`, a Python the CLI does not share) finds
the plugin's destination through its entry point and writes with it. The model is the session's shared server (the
tiny packaged one) on three zero-shot GSM8K problems."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import ServedModel
from tests.unit.test_registry_plugins import plugin_site  # noqa: F401 (the fixture: the plugin, installed)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_jobs_own_python_finds_the_plugins_destination(
    plugin_site: Path,  # noqa: F811
    served_model: Callable[[str], ServedModel],
    isolated_user: Path,
) -> None:
    began = time.monotonic()
    model = served_model("tiny")
    env_file = isolated_user / "env.toml"
    env_file.write_text('[TOYX]\nexecutor = "toy-exporting"\n')
    notebook = isolated_user / "notebook.txt"
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "PYTHONPATH": str(plugin_site),  # installed there (its dist-info's entry points), as in a site-packages
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    argv = [sys.executable, "-m", "ckpteval.cli", "-c", "tiny", "--run", "TOYX", "--env-file", str(env_file)]
    argv += ["-t", "gsm8k", *model.gsm8k_overrides()]
    argv += ["export.toy_notebook.enabled=true", f"export.toy_notebook.path={notebook}"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=isolated_user, timeout=900, check=False)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gsm8k" in done.stdout
    # written by the job's export step, in the job's own Python: the destination came from the entry point there
    assert "exported by export" in notebook.read_text().splitlines()
    listed = subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", "status", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=isolated_user,
    )
    record = json.loads(listed.stdout)[0]
    assert record["state"] == "succeeded" and record["executor"] == "toy-exporting"
    job_dir = isolated_user / "results" / "toy-jobs" / record["invocation"]  # the plugin's executor chose it
    assert (job_dir / "results.json").is_file()
    print(f"\nplugin in a job: {time.monotonic() - began:.0f} s, load {os.getloadavg()[0]:.1f}")
