"""`export_into_cache`: the export a job serves with vLLM or SGLang, kept once per checkpoint content.

Runs inside the job, as its first step (`python -m ckpteval.hfexport cached ...`, planned by
`ckpteval.job.hf_export`). The cache is a directory where the job runs (`<execution.cache_dir>/hf-exports`):

```
hf-exports/
  <content sha256>.<dtype>.tok-<sha256 of the tokenizer's path>/   the export (ckpteval_export.json, parity kept)
  <key>.lock                                                     held while one job exports or checks it
  by-listing/<listing sha256>.json                               the key of a checkpoint's file listing
```

The key is the checkpoint's content identity (`checkpoint.identity.content_identity`: its files' bytes), so
two saves of one training never share an export and a copy of one checkpoint finds its export. One job at a
time holds a key's lock (flock): a second job exporting the same checkpoint waits, then finds the export
written and checked (0 tensors written, the parity kept). `by-listing/` lets a dry run say, without reading
a weight, whether the checkpoint's export is probably there (the job always decides by content).

A Hugging Face directory (config.json, no Megatron tracker or args) needs no export: it is linked as it is.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BY_LISTING = "by-listing"


@dataclass(frozen=True)
class CachedExport:
    """What the job's export step did: the directory served, and how it came to be."""

    served: str  # the directory the engine serves (the export, or a Hugging Face checkpoint as it is)
    checkpoint: str  # the iteration directory exported (or the Hugging Face directory)
    kind: str  # "exported", "reused" (found in the cache) or "huggingface" (served as it is)
    identity: str | None = None  # the checkpoint's content identity (method:sha256)
    waited_s: float = 0.0  # for another job's export of the same checkpoint (its lock)
    seconds: float = 0.0  # the step in all
    tensors_written: int = 0
    export: dict[str, Any] | None = None  # CheckedExport.provenance(): the export and its parity report

    def to_json(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "checkpoint": self.checkpoint,
            "kind": self.kind,
            "identity": self.identity,
            "waited_s": round(self.waited_s, 3),
            "seconds": round(self.seconds, 3),
            "tensors_written": self.tensors_written,
            **(self.export or {}),
        }


def is_hf_directory(path: Path) -> bool:
    """A Hugging Face model directory: config.json, and none of a Megatron checkpoint's files."""
    megatron = ("latest_checkpointed_iteration.txt", "latest_train_state.pt", "common.pt", "run_config.yaml")
    return (path / "config.json").is_file() and not any((path / name).exists() for name in megatron)


def cache_key(sha256: str, dtype: str, tokenizer_dir: str) -> str:
    """The cache entry's name: the content's sha256, the export's dtype, and the tokenizer's directory."""
    return f"{sha256}.{dtype}.tok-{hashlib.sha256(tokenizer_dir.encode()).hexdigest()[:16]}"


def listing_file(cache_dir: str, listing_sha256: str) -> str:
    """Where the cache notes the key a checkpoint of this file listing (names and sizes) was exported under."""
    return f"{cache_dir.rstrip('/')}/{BY_LISTING}/{listing_sha256}.json"


def export_into_cache(
    checkpoint: str | Path,
    cache_dir: str | Path,
    *,
    link: str | Path,
    dtype: str = "checkpoint",
    tokenizer: str | None = None,
    pinned: str | None = None,
    on_note: Callable[[str], None] = lambda _m: None,
) -> CachedExport:
    """Export `checkpoint` (the iteration `pinned`, when given) into the cache, or find it there, prove it
    computes what the checkpoint computes, and point `link` at it. DeploymentError (naming what differs) when
    the parity check fails: nothing is linked then, and the failed export is not kept for another job."""
    from ckpteval.checkpoint.identity import checkpoint_identity, content_identity
    from ckpteval.checkpoint.layout import locate_checkpoint
    from ckpteval.hfexport.checked import export_checked
    from ckpteval.hfexport.write import stored_dtype
    from ckpteval.server.checkpoint import load_checkpoint_info

    started = time.perf_counter()
    source = Path(checkpoint).expanduser()
    if is_hf_directory(source):
        _link(link, source)
        on_note(f"{source} is a Hugging Face directory: served as it is")
        return CachedExport(served=str(source), checkpoint=str(source), kind="huggingface")
    iter_dir = locate_checkpoint(source, pinned=pinned).iter_dir
    on_note(f"hashing {iter_dir} (its content identity keys the export cache)")
    identity = content_identity(iter_dir)
    target_dtype = stored_dtype(iter_dir) if dtype == "checkpoint" else dtype
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    # the tokenizer served with is no part of the content identity (its directory is not hashed): the export
    # records where it came from, so an entry is one content in one dtype with one tokenizer
    key = cache_key(
        identity.sha256, target_dtype, str(load_checkpoint_info(iter_dir, tokenizer=tokenizer).tokenizer_dir)
    )
    output = cache / key
    waited = 0.0
    with _lock(cache / f"{key}.lock", on_wait=on_note) as waited_for:
        result = export_checked(iter_dir, output, dtype=target_dtype, tokenizer=tokenizer)
        waited = waited_for()
    _note_listing(cache, checkpoint_identity(iter_dir).listing_sha256, key)
    _link(link, output)
    export = result.export
    kind = "reused" if export.reused else "exported"
    on_note(
        f"{kind}: {output} ({export.tensors_written} of {export.tensors} tensors written; parity "
        + ("kept from its first check" if result.parity_reused else "checked")
        + ")"
    )
    return CachedExport(
        served=str(output),
        checkpoint=str(iter_dir),
        kind=kind,
        identity=f"{identity.method}:{identity.sha256}",
        waited_s=waited,
        seconds=time.perf_counter() - started,
        tensors_written=export.tensors_written,
        export=result.provenance(),
    )


@contextmanager
def _lock(path: Path, *, on_wait: Callable[[str], None]) -> Iterator[Callable[[], float]]:
    """Hold `path`'s exclusive flock; when another process holds it, say so and wait. Yields a function that
    returns how long the wait was."""
    with open(path, "a") as handle:
        began = time.perf_counter()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait(f"another job is exporting this checkpoint ({path} is locked): waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        waited = time.perf_counter() - began
        try:
            yield lambda: waited
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _note_listing(cache: Path, listing_sha256: str, key: str) -> None:
    path = Path(listing_file(str(cache), listing_sha256))
    path.parent.mkdir(exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(json.dumps({"key": key}) + "\n", encoding="utf-8")
    os.replace(staging, path)


def _link(link: str | Path, target: Path) -> None:
    """`link` -> `target`, replacing an earlier link atomically (a resubmitted job's)."""
    link = Path(link)
    link.parent.mkdir(parents=True, exist_ok=True)
    staging = link.with_name(f".{link.name}.{os.getpid()}")
    staging.unlink(missing_ok=True)
    staging.symlink_to(target.absolute(), target_is_directory=True)
    os.replace(staging, link)
