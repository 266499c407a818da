"""Bring a job directory's results from the cluster to this machine (not its caches).

What comes back: the state files, the logs, and each task's harness output (results, run config,
metrics, reports). What stays: response caches (`cache/`, `lm_cache/`, `*_cache/`: they are what a
resubmitted job replays, and can be gigabytes), databases and lock files, and any single file larger
than `max_file_mb`. A second fetch copies only files that are new or changed (size or mtime).
"""

from __future__ import annotations

import os
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path

from ckpteval.cluster.remote import Remote
from ckpteval.errors import ClusterError

# directory names pruned from the listing (the harness's and the interceptor's response caches)
CACHE_DIRS = ("cache", "lm_cache", "*_cache", ".enroot", "hook")
SKIPPED_FILES = ("*.lock", "*.db", "*.db-journal", "*.sqlite", ".*.tmp", "*.tmp.*")


@dataclass(frozen=True)
class RemoteFile:
    """One file of the job directory: its path relative to it, size and modification time."""

    rel: str
    size: int
    mtime: float


@dataclass(frozen=True)
class FetchResult:
    """What a fetch copied."""

    local_dir: Path
    copied: tuple[str, ...]
    skipped_large: tuple[str, ...]
    bytes: int


def list_job_files(remote: Remote, job_dir: str, *, max_file_mb: int = 200) -> tuple[list[RemoteFile], list[str]]:
    """Files worth bringing back (one `find`), and those left behind for their size."""
    prune = " -o ".join(f"-name {shlex.quote(p)}" for p in CACHE_DIRS)
    skip = " -o ".join(f"-name {shlex.quote(p)}" for p in SKIPPED_FILES)
    script = (
        f"cd {shlex.quote(job_dir)} && find . -mindepth 1 \\( -type d \\( {prune} \\) -prune \\) "
        f"-o \\( -type f ! \\( {skip} \\) -printf '%P\\t%s\\t%T@\\n' \\)"
    )
    result = remote.run(["sh", "-c", script], timeout=300, check=False)
    if result.returncode != 0:
        raise ClusterError(
            f"Cannot list the job directory {job_dir} on {remote.description}: "
            + (result.stderr.strip() or f"exit {result.returncode}")
        )
    files, large = [], []
    for line in result.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        rel, size, mtime = parts[0], int(parts[1]), float(parts[2])
        if size > max_file_mb * 1024 * 1024:
            large.append(rel)
            continue
        files.append(RemoteFile(rel=rel, size=size, mtime=mtime))
    return sorted(files, key=lambda f: f.rel), large


def fetch_job_dir(remote: Remote, job_dir: str, local_dir: Path, *, max_file_mb: int = 200) -> FetchResult:
    """Copy the job directory's result files under `local_dir` (only new or changed files)."""
    files, large = list_job_files(remote, job_dir, max_file_mb=max_file_mb)
    copied, total = [], 0
    for f in files:
        target = local_dir / f.rel
        if target.is_file():
            st = target.stat()
            if st.st_size == f.size and abs(st.st_mtime - f.mtime) < 1.0:
                continue
        remote.get(posixpath.join(job_dir, f.rel), target)
        os.utime(target, (f.mtime, f.mtime))  # the remote time, so the next fetch can compare
        copied.append(f.rel)
        total += f.size
    return FetchResult(local_dir=local_dir, copied=tuple(copied), skipped_large=tuple(large), bytes=total)
