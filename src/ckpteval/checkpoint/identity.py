"""A checkpoint's identity, for results: what tells two checkpoints apart.

Before submission (`checkpoint_identity`, computed while the checkpoint is described, without reading a
weight): a hash of its metadata files' bytes (the args in `common.pt`, the torch_dist index and
`metadata.json`, Megatron-Bridge's `run_config.yaml`), and one of the list of every file of its iteration
directory with its size (`listing_sha256`: a truncated checkpoint changes a size or a name; two iterations
of one run have the same list, so it does not tell them apart).

When the server loads it (`content_identity`, the server's report: `ckpteval.server.loaded`): a hash of the
bytes of every file it reads, the shards included. Whole files up to `FULL_HASH_LIMIT` bytes in all (the
page cache holds them right after the load); above it each shard is sampled (its size, its first and last
MiB and `SAMPLES` blocks of 64 KiB spread over it) and the small files are hashed whole. The sampled hash
tells apart every save of a training (an optimizer step changes every weight) and any rewrite of a file's
size; it misses an edit confined to bytes it does not read (one tensor patched in place): the report says
which method it used. stdlib only.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ckpteval.checkpoint.layout import COMMON_STATE_FILE, DCP_METADATA_FILE, DIST_METADATA_FILE, TOKENIZER_DIR

METADATA_FILES = (COMMON_STATE_FILE, DIST_METADATA_FILE, DCP_METADATA_FILE, "run_config.yaml")
FULL_HASH_LIMIT = 8 * 1024**3  # bytes: whole files up to this much in all, sampled shards above
SAMPLES = 62  # blocks of SAMPLE_BYTES spread over a sampled shard, besides its first and last MiB
SAMPLE_BYTES = 64 * 1024
_EDGE_BYTES = 1024**2
_BLOCK = 1 << 20
FULL = "sha256 of every file"
SAMPLED = (
    f"sha256 of every file up to 1 MiB, of larger ones' size, first and last MiB and {SAMPLES} sampled 64 KiB blocks"
)


@dataclass(frozen=True)
class CheckpointIdentity:
    """What identifies one checkpoint iteration (see the module docstring)."""

    metadata_sha256: str | None  # None: none of METADATA_FILES (a legacy checkpoint keeps its args with its weights)
    metadata_files: tuple[str, ...]
    listing_sha256: str  # of "<relative path>\t<size>\n" of every file, sorted (not of their bytes)
    n_files: int
    total_bytes: int


@dataclass(frozen=True)
class ContentIdentity:
    """What the bytes of one checkpoint iteration are (see the module docstring): `sha256` over every file's
    path and digest; equal for two copies, different for two saves."""

    sha256: str
    method: str  # FULL or SAMPLED
    files: dict[str, str] = field(default_factory=dict)  # relative path -> its digest
    n_files: int = 0
    total_bytes: int = 0
    bytes_read: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "sha256": self.sha256,
            "method": self.method,
            "n_files": self.n_files,
            "total_bytes": self.total_bytes,
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 3),
            "files": dict(self.files),
        }


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
        listing_sha256=files_digest.hexdigest(),
        n_files=len(listing),
        total_bytes=sum(size for _, size in listing),
    )


def content_identity(iter_dir: Path, *, full_limit: int = FULL_HASH_LIMIT) -> ContentIdentity:
    """The content identity of the iteration directory `iter_dir`: every file but its tokenizer directory,
    whole when they hold `full_limit` bytes or fewer in all, else larger files sampled."""
    started = time.perf_counter()
    listing = list_files(iter_dir)
    total = sum(size for _, size in listing)
    sampled = total > full_limit
    digests: dict[str, str] = {}
    read = 0
    for name, size in listing:
        digest, n = (
            _sampled_digest(iter_dir / name, size) if sampled and size > _BLOCK else _file_digest(iter_dir / name)
        )
        digests[name] = digest
        read += n
    whole = hashlib.sha256("".join(f"{name}\t{digests[name]}\n" for name, _ in listing).encode())
    return ContentIdentity(
        sha256=whole.hexdigest(),
        method=SAMPLED if sampled else FULL,
        files=digests,
        n_files=len(listing),
        total_bytes=total,
        bytes_read=read,
        seconds=time.perf_counter() - started,
    )


def _file_digest(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    read = 0
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
            read += len(block)
    return digest.hexdigest(), read


def _sampled_digest(path: Path, size: int) -> tuple[str, int]:
    """Its size, first and last MiB and SAMPLES blocks spread evenly between them."""
    digest = hashlib.sha256(f"{size}\0".encode())
    offsets = [0, max(0, size - _EDGE_BYTES)]
    step = max(1, (size - 2 * _EDGE_BYTES) // (SAMPLES + 1))
    offsets[1:1] = [_EDGE_BYTES + step * (i + 1) for i in range(SAMPLES) if _EDGE_BYTES + step * (i + 1) < size]
    read = 0
    with open(path, "rb") as handle:
        for i, offset in enumerate(offsets):
            handle.seek(offset)
            block = handle.read(_EDGE_BYTES if i in (0, len(offsets) - 1) else SAMPLE_BYTES)
            digest.update(block)
            read += len(block)
    return digest.hexdigest(), read
