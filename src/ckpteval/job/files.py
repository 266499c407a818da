"""The files of a job directory written before anything runs (their names: `ckpteval.invocation.jobdir.JobDir`)."""

from __future__ import annotations

import getpass
import importlib.metadata
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.config.compile import CompiledConfig
from ckpteval.config.executors import Launcher
from ckpteval.config.preview import config_yaml
from ckpteval.invocation.jobdir import JobDir
from ckpteval.invocation.record import now_iso, write_text_atomic
from ckpteval.job.build import owns_endpoint
from ckpteval.job.plan import JobPlan
from ckpteval.job.script import render_job_script

if TYPE_CHECKING:
    from ckpteval.checkpoint.description import CheckpointDescription

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


def provenance(
    compiled: CompiledConfig, plan: JobPlan, checkpoint: CheckpointDescription | None = None
) -> dict[str, Any]:
    """job.yaml: enough to know later how this invocation was made, and what was checked before it ran: the
    checkpoint's identity, its tokenizer and origin (from `checkpoint`, its description; None when the job
    prepares it), the deployment and the harness (results.json's `provenance` is made from these)."""
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
        **checked_checkpoint(checkpoint, compiled),
        "deployment": _deployment(compiled, plan),
        "judge": _judge(compiled, plan),
        "task_images": {t.name: t.runs[0].step.image for t in plan.tasks if t.runs and t.runs[0].step.image},
    }


def _judge(compiled: CompiledConfig, plan: JobPlan) -> dict[str, Any] | None:
    """The judge of the judge-scored tasks (None: none is configured): its role, kind, the model it serves and
    where (the API's URL; the evaluated model's identity when it judges itself; the deployment the job starts
    beside the model: its kind, checkpoint and command). Each task's request settings to the judge are in its run
    config (`config.params.extra.judge`)."""
    judge = compiled.config.judge
    if judge.type == "none":
        return None
    judged = [t.name for t in compiled.tasks if t.spec.judge is not None]
    if judge.type == "api":
        return {"role": "judge", "kind": "api", "model_id": judge.model_id, "url": judge.url, "tasks": judged}
    deployed = plan.deployments.get("judge")
    if deployed is not None:
        step = deployed.step
        return {
            "role": "judge",
            "kind": "deployed",
            "deployment": deployed.kind,
            "model_id": deployed.served_model_name,
            "checkpoint_path": getattr(judge, "checkpoint_path", None),
            "image": step.image if step else None,
            "command": compiled.secrets.redact(step.command) if step else None,
            "tasks": judged,
        }
    return {"role": "judge", "kind": "self", "model_id": compiled.config.target.api_endpoint.model_id, "tasks": judged}


def checked_checkpoint(checkpoint: CheckpointDescription | None, compiled: CompiledConfig) -> dict[str, Any]:
    """The checkpoint as described before submission: `checkpoint` (identity), `tokenizer`, `origin`."""
    import dataclasses

    if checkpoint is None:
        return {"checkpoint": None, "tokenizer": None, "origin": None}
    identity = dataclasses.asdict(checkpoint.identity) if checkpoint.identity else {}
    if identity:
        identity["metadata_files"] = list(identity["metadata_files"])
    token = checkpoint.tokenizer
    origin = None
    if checkpoint.origin is not None:
        ignored = bool(getattr(compiled.config.deployment, "ignore_origin_mismatch", False))
        origin = {
            "origin": checkpoint.origin.origin,
            "config": checkpoint.origin.config,
            "compared": list(checkpoint.origin.compared),
            "disagreements": [str(d) for d in checkpoint.origin.disagreements],
            "not_compared": list(checkpoint.origin.not_compared),
            "mismatch_ignored": ignored and bool(checkpoint.origin.disagreements),
        }
    unexpected = [str(group) for group in checkpoint.unexpected_tensors]
    return {
        "checkpoint": {
            "path": checkpoint.path,
            "layout": checkpoint.layout,
            "format": checkpoint.format,
            "iteration": checkpoint.iteration,
            **identity,
            # tensors the args' model lacks, seen in the tensor index: only there when allowed
            "unexpected_tensors": unexpected,
            "unexpected_tensors_ignored": bool(unexpected)
            and bool(getattr(compiled.config.deployment, "ignore_unexpected_tensors", False)),
        },
        "tokenizer": None
        if token is None
        else {"kind": token.kind, "origin": token.origin, "hub_id": token.hub_id, "sha256": token.sha256},
        "origin": origin,
    }


def _deployment(compiled: CompiledConfig, plan: JobPlan) -> dict[str, Any]:
    """The deployment as the job starts it: its kind, image and command line (Export-Deploy's: the entry point
    the image was probed for), the served model name."""
    step = plan.deployment.step
    return {
        "kind": plan.deployment.kind,
        "image": step.image if step else None,
        "command": compiled.secrets.redact(step.command) if step else None,
        "served_model_name": getattr(compiled.config.deployment, "served_model_name", None),
        "url": None if step else compiled.config.target.api_endpoint.url,
        # whether the endpoint is the job's own (else it is probed for mixing other clients' settings)
        "endpoint_owned": owns_endpoint(compiled),
        "serving": _serving(compiled, step.command if step else None),
    }


def _serving(compiled: CompiledConfig, command: str | None) -> dict[str, Any]:
    """How the deployment computes (what `compare` warns of when two runs differ): its device, dtype and
    prefix cache, as configured (the command line's `--dtype`, else the server's own choice: `auto`)."""
    import shlex

    deployment = compiled.config.deployment
    try:
        words = shlex.split(command) if command else []
    except ValueError:  # a generic command of the user's own that is no list of words: no dtype read from it
        words = []
    dtype = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "--dtype"), None)
    dtype = dtype or next((w.split("=", 1)[1] for w in words if w.startswith("--dtype=")), None)
    out = {
        "device": getattr(deployment, "device", None),
        "dtype": dtype or ("auto" if command else None),
        "prefix_cache": getattr(deployment, "prefix_cache", None),
    }
    return {k: v for k, v in out.items() if v is not None}


def job_files(
    compiled: CompiledConfig,
    plan: JobPlan,
    *,
    launcher: Launcher,
    header: str = "",
    checkpoint: CheckpointDescription | None = None,
) -> dict[str, str]:
    """Relative path -> text of every file the job needs before it starts (`checkpoint`: its description,
    recorded in job.yaml)."""
    import yaml

    redact = compiled.secrets.redact
    files = {
        JobDir.CONFIG: config_yaml(compiled),
        JobDir.PROVENANCE: redact(yaml.safe_dump(provenance(compiled, plan, checkpoint), sort_keys=False)),
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
