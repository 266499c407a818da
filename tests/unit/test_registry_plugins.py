"""A plugin package registers an executor, a deployment backend and an export destination through Python entry
points (`ckpteval.registry`), and nothing else: installed (here into a throwaway directory on PYTHONPATH, with
`uv pip install --target`), the CLI finds all three, and so does a job's Python (a fresh process that asks the
destinations' registry, as the job's export step does); not installed, the CLI refuses the profile naming the
executor and says where executors come from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PYPROJECT = """\
[project]
name = "toy-ckpteval-plugin"
version = "0.1"

[project.entry-points."ckpteval.executors"]
toy = "toy_plugin:EXECUTOR"
toy-exporting = "toy_plugin:EXPORTING"

[project.entry-points."ckpteval.deployments"]
toy-health = "toy_plugin:DEPLOYMENT"

[project.entry-points."ckpteval.destinations"]
toy_notebook = "toy_plugin:DESTINATION"

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[tool.hatch.build.targets.wheel]
packages = ["toy_plugin"]
"""

MODULE = '''\
"""A toy plugin: an executor (jobs here, in a subdirectory), a deployment backend, a destination."""
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ckpteval.config.executors import Executor
from ckpteval.config.schema import Endpoints
from ckpteval.deploy.backends import DeploymentBackend, Launch
from ckpteval.execution.local import LocalBackend, local_job_dir
from ckpteval.export.destinations import ExportDestination
from ckpteval.export.outcome import ExportOutcome


class ToyBackend(LocalBackend):
    executor = "toy"

    def job_dir(self, compiled, invocation):
        path = local_job_dir(compiled, invocation)
        return str(path.parent / "toy-jobs" / invocation)


class ToyExportingBackend(ToyBackend):
    """The same, but its jobs export their results themselves (as a Slurm job does): the export step of the job
    asks the destinations' registry in the job's own Python."""

    executor = "toy-exporting"
    exports_here = False


@dataclass(frozen=True, kw_only=True)
class ToyHealth:
    type: Literal["toy-health"]
    port: int = 8123
    served_model_name: str = "toy"
    tokenizer: str | None = None
    env_vars: dict = field(default_factory=dict)
    endpoints: Endpoints = Endpoints(completions="/v1/completions", chat="/v1/chat/completions", health="/v1/health")


@dataclass(frozen=True, kw_only=True)
class ToyNotebook:
    enabled: bool = False
    path: str = "notebook.jsonl"


def _write(content, settings, context):
    # which ckpteval entry point wrote it: "export" in a job's export step (python -m ckpteval.export)
    with open(settings.path, "a") as out:
        out.write(f"exported by {Path(sys.argv[0]).parent.name}\\n")
    return ExportOutcome("toy_notebook", "exported", settings.path)


EXECUTOR = Executor(
    name="toy",
    backend="toy_plugin:ToyBackend",
    config_group="local",
    launcher="processes",
    on_cluster=False,
    watch_max_pending=1,
    watch_follow_every=5.0,
)
EXPORTING = Executor(
    name="toy-exporting",
    backend="toy_plugin:ToyExportingBackend",
    config_group="local",
    launcher="processes",
    on_cluster=False,
    watch_max_pending=1,
    watch_follow_every=5.0,
)
DEPLOYMENT = DeploymentBackend(
    "toy-health", ToyHealth, lambda d, c: Launch(command=f"toy-health-server --port {c.port}", mounted=False)
)
DESTINATION = ExportDestination("toy_notebook", "Toy notebook", ToyNotebook, _write)
'''


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy plugin, built and installed (with its entry points) into a directory of its own."""
    uv = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    root = tmp_path_factory.mktemp("plugin")
    package = root / "toy-plugin"
    (package / "toy_plugin").mkdir(parents=True)
    (package / "pyproject.toml").write_text(PYPROJECT)
    (package / "toy_plugin" / "__init__.py").write_text(MODULE)
    site = root / "site"
    done = subprocess.run(
        [
            uv,
            "pip",
            "install",
            "--offline",
            "--no-deps",
            "--python",
            sys.executable,
            "--target",
            str(site),
            str(package),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert list(site.glob("toy_ckpteval_plugin-0.1.dist-info/entry_points.txt"))
    return site


def _python(args: list[str], site: Path | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, check=False, cwd=cwd, env=env
    )


def test_an_installed_plugin_is_found_by_the_cli(plugin_site: Path, tmp_path: Path) -> None:
    env_file = tmp_path / "env.toml"
    env_file.write_text('[TOY]\nexecutor = "toy"\ntunnel = "local"\n')
    argv = [
        "-m",
        "ckpteval.cli",
        "-c",
        "tiny",
        "--run",
        "TOY",
        "--env-file",
        str(env_file),
        "--dry-run",
        "deployment=toy-health",
        "deployment.port=8124",
        "export.toy_notebook.enabled=true",
        f"export.toy_notebook.path={tmp_path / 'nb.jsonl'}",
        "target.api_endpoint.type=completions",
    ]
    shown = _python(argv, plugin_site, tmp_path)
    assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-3000:]
    assert "toy-health-server --port 8124" in shown.stdout  # the plugin's deployment, in the job script
    assert "toy-jobs" in shown.stdout  # the plugin's executor chose the job directory
    assert "toy_notebook" in shown.stdout  # the plugin's destination's section, in the compiled config

    refused = _python(argv, None, tmp_path)  # not installed: the profile's executor is unknown
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "'executor' is 'toy'" in refused.stderr and "ckpteval.executors" in refused.stderr


def test_a_jobs_python_finds_the_installed_destination(plugin_site: Path, tmp_path: Path) -> None:
    """What the job's export step (`python -m ckpteval.export`) asks: the destinations registered there."""
    code = textwrap.dedent(
        """
        from ckpteval.export.destinations import destination
        from ckpteval.export.invocation import export_section
        section = export_section({"export": {"toy_notebook": {"enabled": True, "path": "x"}}})
        print(destination("toy_notebook").label, section.get("toy_notebook").enabled)
        """
    )
    found = _python(["-c", code], plugin_site, tmp_path)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "Toy notebook True"
