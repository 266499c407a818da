"""The files of a job directory written before anything runs (their names: `ckpteval.invocation.jobdir.JobDir`)."""

from __future__ import annotations

import getpass
import importlib.metadata
import socket
import sys
from pathlib import Path
from typing import Any

from ckpteval.config.compile import CompiledConfig
from ckpteval.config.preview import config_yaml
from ckpteval.invocation.jobdir import JobDir
from ckpteval.invocation.record import now_iso, write_text_atomic
from ckpteval.job.plan import JobPlan
from ckpteval.job.script import Launcher, render_job_script

VERSIONED = (
    "ckpteval",
    "nemo-evaluator",
    "nemo-evaluator-launcher",
    "nvidia-lm-eval",
    "megatron-core",
    "torch",
    "nemo-run",
    "hydra-core",
)


def versions() -> dict[str, str]:
    """Installed versions of what decides a score (read from package metadata; imports nothing)."""
    out = {}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def provenance(compiled: CompiledConfig, plan: JobPlan) -> dict[str, Any]:
    """job.yaml: enough to know later how this invocation was made."""
    return {
        "invocation": plan.invocation,
        "created": now_iso(),
        "command_line": [compiled.secrets.redact(a) for a in ["evaluate", *sys.argv[1:]]],
        "mode": compiled.mode,
        "profile": compiled.profile.name,
        "env_file": str(compiled.env_file) if compiled.env_file else None,
        "config_files": [str(p) for p in compiled.config_files],
        "overrides": [compiled.secrets.redact(o) for o in compiled.request.overrides],
        "tasks": [t.name for t in compiled.tasks],
        "user": getpass.getuser(),
        "host": socket.gethostname(),
        "versions": versions(),
    }


def job_files(compiled: CompiledConfig, plan: JobPlan, *, launcher: Launcher, header: str = "") -> dict[str, str]:
    """Relative path -> text of every file the job needs before it starts."""
    import yaml

    redact = compiled.secrets.redact
    files = {
        JobDir.CONFIG: config_yaml(compiled),
        JobDir.PROVENANCE: redact(yaml.safe_dump(provenance(compiled, plan), sort_keys=False)),
        JobDir.SCRIPT: redact(render_job_script(plan, launcher=launcher, header=header)),
    }
    for task in plan.tasks:
        if task.repeats:
            files[JobDir.task_repeats(task.dir)] = f"{task.repeats}\n"
        for run in task.runs:
            files[f"{task.dir}/{run.layout.run_config}"] = redact(yaml.safe_dump(run.run_config, sort_keys=False))
    return files


def write_job_files(directory: Path, files: dict[str, str]) -> None:
    """Write the files under `directory`, each atomically; the job script executable."""
    for rel, text in files.items():
        write_text_atomic(directory / rel, text, mode=0o755 if rel == JobDir.SCRIPT else 0o644)
