"""OmegaConf resolvers our configs use.

- `${art:model,path}`: the checkpoint path of the model named by `run.model` (a path, or a W&B model
  artifact `name:latest` / `name:v3` resolved through `ckpteval.export.artifacts`).
- `${secret:NAME}`: the value of environment variable NAME, remembered as a secret (redacted in
  every preview, saved config and log).
- `${ckpteval_cache:}`: this user's ckpteval cache directory.
"""

from __future__ import annotations

import contextvars
import os
from pathlib import Path
from typing import Any

from ckpteval.config.secrets import SecretValues
from ckpteval.errors import ConfigError

_secrets: contextvars.ContextVar[SecretValues | None] = contextvars.ContextVar("ckpteval_secrets", default=None)
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
        from ckpteval.export.artifacts import resolve_model_artifact

        return resolve_model_artifact(value, wandb_settings=run.get("wandb"))
    return os.path.expanduser(value)


def _secret(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(
            f"${{secret:{name}}}: environment variable {name} is not set.",
            hint=f"export {name}=... before running, or remove the reference.",
        )
    registry = _secrets.get()
    if registry is not None:
        registry.add(value)
    return value


def _cache(sub: str = "") -> str:
    return str(cache_dir() / sub) if sub else str(cache_dir())


def register_resolvers() -> None:
    """Register our resolvers with OmegaConf (once per process)."""
    global _registered
    if _registered:
        return
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("art", _art, replace=True)
    OmegaConf.register_new_resolver("secret", _secret, replace=True)
    OmegaConf.register_new_resolver("ckpteval_cache", _cache, replace=True)
    _registered = True


def collecting_secrets(registry: SecretValues) -> contextvars.Token[SecretValues | None]:
    """Make `${secret:...}` resolutions add to `registry` until the token is reset."""
    return _secrets.set(registry)


def stop_collecting(token: contextvars.Token[SecretValues | None]) -> None:
    """Undo `collecting_secrets`."""
    _secrets.reset(token)
