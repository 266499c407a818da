"""Builders of tiny real Megatron checkpoints, one module per kind (architectures, tokenizers, layouts,
sharded saves): each `build_<name>(out_dir) -> Path` runs on the CPU in seconds.

`built_once` shares a set of them between every test module of one pytest session (the unit parity tests
and the e2e corpus need the same checkpoints; building them takes minutes of megatron import and saving)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def built_once(factory: Any, name: str, build: Callable[[Path], dict[str, Path]]) -> dict[str, Path]:
    """What `build(root)` writes under the session's `corpus-<name>` directory, built by the first test module
    that asks (`factory` is pytest's tmp_path_factory) and read back by the others."""
    root = Path(factory.getbasetemp()) / f"corpus-{name}"
    index = root / "built.json"
    if index.is_file():
        return {key: Path(path) for key, path in json.loads(index.read_text()).items()}
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    paths = build(root)
    index.write_text(json.dumps({key: str(path) for key, path in paths.items()}))
    return paths
