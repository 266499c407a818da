"""OmegaConf resolvers our configs use.

- `${art:model,path}`: the checkpoint path of the model named by `run.model` (a path, or a W&B model
  artifact `name:latest` / `name:v3` resolved by the `ArtifactResolver` the caller passes in:
  `ckpteval.compile_config` passes `ckpteval.export.artifacts.resolve_model_artifact`, which sits in a
  higher layer than config/).
- `${secret:NAME}`: the value of environment variable NAME, remembered as a secret (redacted in
  every preview, saved config and log).
- `${ckpteval_cache:}`: this user's ckpteval cache directory.
"""

from __future__ import annotations

import contextvars
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ckpteval.config.secrets import SecretValues
from ckpteval.errors import ConfigError


class ResolvedArtifact(Protocol):
    """What an artifact resolver returns: at least the checkpoint path (the dry run's note reads more)."""

    @property
    def path(self) -> str: ...


class ArtifactResolver(Protocol):
    """Resolves `run.model` naming a model artifact; `wandb_settings` is `run.wandb` (entity, project)."""

    def __call__(self, value: str, *, wandb_settings: Any = None) -> ResolvedArtifact: ...


@dataclass
class _Scope:
    """What one config resolution collects: secret values, and the artifacts it resolved (each once:
    `${art:model,path}` may be reached from several keys, and each resolution is a network call)."""

    secrets: SecretValues
    resolve_artifact: ArtifactResolver | None = None
    artifacts: dict[tuple[str, str | None, str | None], ResolvedArtifact] = field(default_factory=dict)


_scope: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("ckpteval_resolution", default=None)
_registered = False


def cache_dir() -> Path:
    """This user's ckpteval cache directory (`$XDG_CACHE_HOME/ckpteval`)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "ckpteval"


def looks_like_artifact(value: str) -> bool:
    """True for `name:alias` / `entity/project/name:alias` references, false for filesystem paths."""
    if value.startswith(("/", "./", "../", "~")) or ":" not in value:
        return False
    name, _, alias = value.rpartition(":")
    return bool(name) and bool(alias) and "/" not in alias


def _art(name: str, attribute: str, *, _root_: Any) -> str:
    run = _root_.get("run")
    value = run.get(name) if run is not None else None
    if value is None:
        raise ConfigError(
            f"run.{name} is not set, so ${{art:{name},{attribute}}} has nothing to resolve.",
            hint=f"Pass run.{name}=/path/to/checkpoint (or a W&B artifact like my-model:latest), "
            "or set deployment.checkpoint_path directly.",
        )
    if attribute != "path":
        raise ConfigError(f"${{art:{name},{attribute}}}: only the `path` attribute exists.")
    value = str(value)
    if looks_like_artifact(value):
        return _model_artifact(value, run.get("wandb")).path
    return os.path.expanduser(value)


def _model_artifact(value: str, wandb_node: Any) -> ResolvedArtifact:
    settings = {
        "entity": wandb_node.get("entity") if wandb_node is not None else None,
        "project": wandb_node.get("project") if wandb_node is not None else None,
    }
    scope = _scope.get()
    cache_key = (value, settings["entity"], settings["project"])
    if scope is not None and cache_key in scope.artifacts:
        return scope.artifacts[cache_key]
    if scope is None or scope.resolve_artifact is None:
        raise ConfigError(
            f"run.model={value} names a model artifact, and nothing here resolves artifacts.",
            hint="Compile through ckpteval.compile_config (or pass resolve_artifact=), or give a checkpoint path.",
        )
    resolved = scope.resolve_artifact(value, wandb_settings=settings)
    if scope is not None:
        scope.artifacts[cache_key] = resolved
    return resolved


def _secret(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(
            f"${{secret:{name}}}: environment variable {name} is not set.",
            hint=f"export {name}=... before running, or remove the reference.",
        )
    scope = _scope.get()
    if scope is not None:
        scope.secrets.add(value)
    return value


def _cache(sub: str = "") -> str:
    return str(cache_dir() / sub) if sub else str(cache_dir())


def _first_set(*values: Any) -> Any:
    """`${first_set:a,b,...}`: the first value that is not null (oc.select returns an explicit null)."""
    return next((v for v in values if v is not None), None)


def _mul(*values: Any) -> int:
    """`${ckpteval_mul:a,b}`: the product of integers (GPUs per node times nodes)."""
    product = 1
    for value in values:
        product *= int(value)
    return product


def register_resolvers() -> None:
    """Register our resolvers with OmegaConf (once per process)."""
    global _registered
    if _registered:
        return
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("art", _art, replace=True)
    OmegaConf.register_new_resolver("secret", _secret, replace=True)
    OmegaConf.register_new_resolver("ckpteval_cache", _cache, replace=True)
    OmegaConf.register_new_resolver("first_set", _first_set, replace=True)
    OmegaConf.register_new_resolver("ckpteval_mul", _mul, replace=True)
    _registered = True


def collecting_secrets(
    registry: SecretValues, resolve_artifact: ArtifactResolver | None = None
) -> contextvars.Token[_Scope | None]:
    """Make `${secret:...}` resolutions add to `registry`, and `${art:...}` go through `resolve_artifact`
    (each resolution remembered), until the token is reset."""
    return _scope.set(_Scope(secrets=registry, resolve_artifact=resolve_artifact))


def resolved_artifacts() -> list[ResolvedArtifact]:
    """The model artifacts resolved since `collecting_secrets` (for the dry run's notes)."""
    scope = _scope.get()
    return list(scope.artifacts.values()) if scope is not None else []


def stop_collecting(token: contextvars.Token[_Scope | None]) -> None:
    """Undo `collecting_secrets`."""
    _scope.reset(token)
