"""vLLM and SGLang on a Megatron checkpoint: the job's export step, planned before submission.

A deployment whose backend `serves_hf_export` (vLLM, SGLang) and whose `checkpoint_path` is a Megatron
checkpoint gets a step before the engine starts (`job.script` runs it, and starts the engine only when it
succeeded): `python -m ckpteval.hfexport cached` exports the checkpoint into the cache where the job runs
(`<execution.cache_dir>/hf-exports`, keyed by the checkpoint's content identity, one job at a time per entry)
or finds it there, checks its parity with the checkpoint, and links it at `<job_dir>/hf_export`, which the
engine serves and the task clients read the tokenizer from (`ckpteval.hfexport.cache`).

Whether the checkpoint is a Megatron one is known here when it can be read here (this machine, or a
description read from the cluster); otherwise (a cluster dry run without --check) the step is planned and
decides in the job: a Hugging Face directory is linked as it is.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import copy
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.invocation.jobdir import JobDir

if TYPE_CHECKING:
    from ckpteval.checkpoint.description import CheckpointDescription
    from ckpteval.config.compile import CompiledConfig
    from ckpteval.job.plan import JobPlan, Step

CACHE_SUBDIR = "hf-exports"
HF_LAYOUT = "huggingface"  # CheckpointDescription.layout of a Hugging Face directory


def export_cache_dir(compiled: CompiledConfig) -> str:
    """Where the job's exports are kept: under `execution.cache_dir` (on the cluster for Slurm)."""
    return f"{compiled.config.execution.cache_dir.rstrip('/')}/{CACHE_SUBDIR}"


def make_cache_dir(plan: JobPlan, compiled: CompiledConfig, remote: Any) -> tuple[JobPlan, str | None]:
    """Before the job starts (vLLM's and SGLang's `DeploymentBackend.before_start`): the export cache made where
    the job runs, when the job exports a Megatron checkpoint: its steps' containers mount it, and a
    container's mount must exist before it starts."""
    if plan.deployment.export_step is not None:
        remote.run(["mkdir", "-p", export_cache_dir(compiled)], check=True, timeout=60)
    return plan, None


def served_link(job_dir: str) -> str:
    """The link the export step makes to the directory the engine serves."""
    return JobDir(job_dir).join(JobDir.HF_EXPORT)


def needs_export(compiled: CompiledConfig, *, layout: str | None = None) -> bool:
    """Whether the deployment serves a Megatron checkpoint through an export: a backend that serves Hugging Face
    directories, a `checkpoint_path` (not a hub handle) that is not one. `layout`: the checkpoint's, when it
    was described; else read here when the job runs here, and left to the job on a cluster."""
    from ckpteval.deploy.backends import backend_for
    from ckpteval.hfexport.cache import is_hf_directory

    deployment = compiled.config.deployment
    checkpoint = getattr(deployment, "checkpoint_path", None)
    if not checkpoint or getattr(deployment, "hf_model_handle", None) or not backend_for(deployment).serves_hf_export:
        return False
    if layout is not None:
        return layout != HF_LAYOUT
    if compiled.config.execution.on_cluster:
        return True
    return not is_hf_directory(Path(checkpoint).expanduser())


def export_step(
    compiled: CompiledConfig,
    *,
    job_dir: str,
    python: str,
    containers: bool,
    mounts: tuple[str, ...],
    pinned: str | None,
) -> Step:
    """The step that exports (or finds) the checkpoint and links it for the engine: ckpteval's Python (the
    profile's image on a cluster, as the builtin server's), the job's mounts and the cache, writable."""
    from ckpteval.job.plan import Step

    deployment = compiled.config.deployment
    cache = export_cache_dir(compiled)
    argv = [
        python,
        "-m",
        "ckpteval.hfexport",
        "cached",
        str(getattr(deployment, "checkpoint_path", "")),
        "--cache",
        cache,
        "--link",
        served_link(job_dir),
        "--report",
        JobDir(job_dir).join(JobDir.HF_EXPORT_REPORT),
        "--dtype",
        getattr(deployment, "export_dtype", "checkpoint"),
    ]
    from ckpteval.checkpoint.description import user_tokenizer

    tokenizer = user_tokenizer(deployment)
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    if pinned is not None:
        argv += ["--pinned", pinned]
    image = compiled.profile.part.step_image() if containers else None
    return Step(
        command="exec " + shlex.join(argv),
        env=dict(compiled.config.execution.env_vars),
        image=image,
        mounts=(*mounts, f"{cache}:{cache}") if image else (),
    )


def engine_mounts(compiled: CompiledConfig) -> tuple[str, ...]:
    """What the engine's container needs besides the job's mounts: the cache the link points into (read-only)."""
    cache = export_cache_dir(compiled)
    return (f"{cache}:{cache}:ro",)


def with_export_tokenizer(evaluator_config: dict[str, Any], compiled: CompiledConfig, job_dir: str) -> dict[str, Any]:
    """A task's evaluator config with its tokenizer the export's (the link), where it was the Megatron
    checkpoint's path (the deployment's default, which is no Hugging Face tokenizer directory)."""
    deployment = compiled.config.deployment
    extra = ((evaluator_config.get("config") or {}).get("params") or {}).get("extra")
    checkpoint = str(getattr(deployment, "checkpoint_path", "") or "").rstrip("/")
    if not isinstance(extra, dict) or str(extra.get("tokenizer") or "").rstrip("/") != checkpoint:
        return evaluator_config
    out = copy.deepcopy(evaluator_config)
    out["config"]["params"]["extra"]["tokenizer"] = served_link(job_dir)
    return out


def export_status(compiled: CompiledConfig, description: CheckpointDescription, remote: Any) -> str:
    """For the preview: whether the checkpoint's export is in the cache where the job runs, found by its file
    listing (names and sizes: no weight read here); the job decides by content."""
    cache = export_cache_dir(compiled)
    if description.layout == HF_LAYOUT:
        return "none needed: a Hugging Face directory, served as it is"
    listing = description.identity.listing_sha256 if description.identity else None
    key = _cached_key(remote, cache, listing) if listing else None
    if key is not None:
        return (
            f"cached: {cache}/{key} (found by the checkpoint's file listing; the job confirms its content "
            "identity, reuses it and writes 0 tensors)"
        )
    return f"not cached: the job's first step exports it into {cache}/<content sha256>... and checks its parity"


def _cached_key(remote: Any, cache: str, listing: str) -> str | None:
    import json

    from ckpteval.hfexport.cache import listing_file
    from ckpteval.hfexport.write import MANIFEST_FILE

    text = remote.read_text_if_exists(listing_file(cache, listing))
    try:
        key = json.loads(text)["key"] if text else None
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(key, str) or not remote.exists(f"{cache}/{key}/{MANIFEST_FILE}"):
        return None
    return key
