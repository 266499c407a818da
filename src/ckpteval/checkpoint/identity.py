"""A checkpoint's identity, for results: what tells two checkpoints apart without reading a weight.

Two hashes: one of its metadata files' bytes (the args in `common.pt`, the torch_dist index and
`metadata.json`, Megatron-Bridge's `run_config.yaml`), one of the list of every file of its iteration
directory with its size (the shards: a retrained or truncated checkpoint changes a size or a name). stdlib
only: it is computed while the checkpoint is described, before submission.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ckpteval.checkpoint.layout import COMMON_STATE_FILE, DCP_METADATA_FILE, DIST_METADATA_FILE, TOKENIZER_DIR

METADATA_FILES = (COMMON_STATE_FILE, DIST_METADATA_FILE, DCP_METADATA_FILE, "run_config.yaml")


@dataclass(frozen=True)
class CheckpointIdentity:
    """What identifies one checkpoint iteration (see the module docstring)."""

    metadata_sha256: str | None  # None: none of METADATA_FILES (a legacy checkpoint keeps its args with its weights)
    metadata_files: tuple[str, ...]
    files_sha256: str  # of "<relative path>\t<size>\n" of every file, sorted
    n_files: int
    total_bytes: int


def list_files(iter_dir: Path) -> list[tuple[str, int]]:
    """(path relative to `iter_dir`, size) of every file under it but its tokenizer directory, sorted."""
    out = []
    for path in iter_dir.rglob("*"):
        rel = path.relative_to(iter_dir)
        if rel.parts[0] == TOKENIZER_DIR or not path.is_file():
            continue
        out.append((rel.as_posix(), path.stat().st_size))
    return sorted(out)


def checkpoint_identity(iter_dir: Path, files: Iterable[tuple[str, int]] | None = None) -> CheckpointIdentity:
    """The identity of the iteration directory `iter_dir`; `files` is its listing when it was made elsewhere
    (a cluster checkpoint, whose metadata files alone were copied here)."""
    listing = sorted(files) if files is not None else list_files(iter_dir)
    files_digest = hashlib.sha256("".join(f"{name}\t{size}\n" for name, size in listing).encode())
    present = [name for name in METADATA_FILES if (iter_dir / name).is_file()]
    metadata = None
    if present:
        digest = hashlib.sha256()
        for name in present:
            digest.update(f"\0{name}\0".encode())
            with open(iter_dir / name, "rb") as handle:
                for block in iter(lambda h=handle: h.read(1 << 20), b""):  # type: ignore[misc]
                    digest.update(block)
        metadata = digest.hexdigest()
    return CheckpointIdentity(
        metadata_sha256=metadata,
        metadata_files=tuple(present),
        files_sha256=files_digest.hexdigest(),
        n_files=len(listing),
        total_bytes=sum(size for _, size in listing),
    )
