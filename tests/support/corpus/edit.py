"""A copy of a real checkpoint with its args changed: how a test makes a checkpoint that sets a forward-changing
arg, names another tokenizer, or lacks a piece, from one megatron-core saved itself (the weights stay as saved)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

_DROP = object()


def with_args(source: Path, target: Path, *, drop: tuple[str, ...] = (), **changes: Any) -> Path:
    """Copy checkpoint root `source` to `target` with `changes` set in (and `drop` removed from) the args of
    every iteration's common.pt; returns `target`. Other files are copied as they are."""
    import torch

    shutil.copytree(source, target)
    for common in target.glob("*/common.pt"):
        state = torch.load(common, map_location="cpu", weights_only=False)
        args = state["args"]
        for name in drop:
            if hasattr(args, name):
                delattr(args, name)
        for name, value in changes.items():
            setattr(args, name, value)
        torch.save(state, common)
    return target


def make_world_readable(path: Path) -> None:
    """Let other users (the Slurm test user) read `path` and pass through its parents."""
    for item in [path, *path.rglob("*")]:
        item.chmod(0o755 if item.is_dir() else 0o644)
    for parent in path.parents:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o005)
