"""Datasets staged on a cluster: `${remote_job_dir}/datasets/`, a copy of the local dataset cache's entries.

The cluster's cache has the layout of the local one (`ckpteval.tasks.data_cache`): an `HF_HOME` with one
manifest per dataset under `ckpteval/`. `staged_status` asks, in one round trip, which manifests are
there with the same content as here. `push_datasets` sends the missing ones as one tar stream to
`stage_datasets.sh` (under a lock, checked by sha256, manifest moved last), so a second push of the
same datasets sends nothing but the check.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import io
import posixpath
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ckpteval.errors import ClusterError, ConfigError
from ckpteval.tasks.data_cache import is_cached, manifest_rel, offline_env, read_manifest
from ckpteval.tasks.datasets import DatasetRef

if TYPE_CHECKING:
    from ckpteval.cluster.remote import Remote
    from ckpteval.config.profiles import Profile

DATASETS_DIR = "datasets"
STATUS_PREFIX = "ckpteval-data: "


def datasets_dir(profile: Profile) -> str:
    """`${remote_job_dir}/datasets` where the profile's jobs run, a Slurm cluster or a machine reached over SSH
    (ConfigError if remote_job_dir is missing or relative)."""
    from ckpteval.config.executors import remote_part

    rjd = remote_part(profile).remote_job_dir
    if not rjd:
        raise ConfigError(
            f"Profile [{profile.name}] has no `remote_job_dir`, where the staged datasets are kept.",
            hint='Set remote_job_dir = "/data/.../ckpteval" (a directory you can write there) in env.toml.',
        )
    if not rjd.startswith("/"):
        raise ConfigError(
            f"Profile [{profile.name}]: remote_job_dir must be an absolute path there, not {rjd!r}.",
            hint="Write it out in full (~ and $HOME are not expanded).",
        )
    return posixpath.join(posixpath.normpath(rjd), DATASETS_DIR)


def _manifest_bytes(root: Path, ref: DatasetRef) -> bytes:
    return (root / manifest_rel(ref)).read_bytes()


def staged_status(
    remote: Remote, remote_root: str, refs: Sequence[DatasetRef], local_root: Path
) -> dict[DatasetRef, bool]:
    """One round trip: for each of `refs`, whether the cluster has its manifest with the local content.

    A dataset not in the local cache counts as staged when any manifest of it is on the cluster."""
    if not refs:
        return {}
    paths = [posixpath.join(remote_root, manifest_rel(ref)) for ref in refs]
    script = 'for f in "$@"; do if [ -s "$f" ]; then sha256sum < "$f" | cut -c1-64; else echo -; fi; done'
    result = remote.run(["sh", "-c", script, "ckpteval-check", *paths], timeout=120)
    answers = result.stdout.split()
    if len(answers) != len(refs):
        raise ClusterError(
            f"Unexpected answer from {remote.description} while checking staged datasets: "
            f"{result.stdout[-300:]!r} {result.stderr[-300:]!r}."
        )
    out = {}
    for ref, answer in zip(refs, answers, strict=True):
        if answer == "-":
            out[ref] = False
        elif is_cached(local_root, ref):
            out[ref] = answer == hashlib.sha256(_manifest_bytes(local_root, ref)).hexdigest()
        else:
            out[ref] = True
    return out


def push_archive(local_root: Path, refs: Sequence[DatasetRef]) -> bytes:
    """The tar stream `stage_datasets.sh` reads: each dataset's files, manifest and file list, SHA256SUMS."""
    buffer = io.BytesIO()
    sums: list[str] = []
    added: set[str] = set()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for ref in refs:
            manifest = read_manifest(local_root, ref)
            names = sorted([*manifest["files"], *manifest.get("links", {})])
            for rel in names:
                if rel in added:
                    continue
                added.add(rel)
                tar.add(local_root / rel, arcname=rel, recursive=False)
                if rel in manifest["files"]:
                    sums.append(f"{manifest['files'][rel][1]}  {rel}")
            body = _manifest_bytes(local_root, ref)
            _add_bytes(tar, manifest_rel(ref), body)
            sums.append(f"{hashlib.sha256(body).hexdigest()}  {manifest_rel(ref)}")
            _add_bytes(tar, f"lists/{ref.slug}", ("\n".join(names) + "\n").encode())
        _add_bytes(tar, "SHA256SUMS", ("\n".join(sums) + "\n").encode())
    return buffer.getvalue()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def stage_script() -> str:
    """The bash script that unpacks a push on the login node (see stage_datasets.sh), code lines only."""
    text = importlib.resources.files("ckpteval.cluster").joinpath("stage_datasets.sh").read_text(encoding="utf-8")
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


@dataclass(frozen=True)
class PushResult:
    """What `push_datasets` did, and what it cost: bytes sent and round trips."""

    remote_root: str
    staged: tuple[DatasetRef, ...]  # sent by this push
    present: tuple[DatasetRef, ...]  # already there (or staged meanwhile by another push)
    bytes_sent: int
    round_trips: int


def push_datasets(remote: Remote, remote_root: str, refs: Sequence[DatasetRef], local_root: Path) -> PushResult:
    """Put each of `refs` (all in the local cache `local_root`) into `remote_root` unless it is there."""
    refs = list(dict.fromkeys(refs))
    status = staged_status(remote, remote_root, refs, local_root)
    missing = [ref for ref in refs if not status[ref]]
    present = [ref for ref in refs if status[ref]]
    if not missing:
        return PushResult(remote_root, (), tuple(present), 0, 1)
    archive = push_archive(local_root, missing)
    argv = ["bash", "-c", stage_script(), "ckpteval-data", remote_root, *(ref.slug for ref in missing)]
    result = remote.run(argv, stdin=archive, check=False, timeout=3600)
    if result.returncode != 0:
        ours = [
            line.removeprefix(STATUS_PREFIX + "error: ") for line in result.stderr.splitlines() if STATUS_PREFIX in line
        ]
        detail = "; ".join(ours) or result.stderr.strip()[-500:]
        raise ClusterError(
            f"Staging datasets into {remote_root} on {remote.description} failed: {detail}.",
            hint="Nothing was marked staged; fix the cause and run `evaluate data push` again.",
        )
    by_slug = {ref.slug: ref for ref in missing}
    staged: list[DatasetRef] = []
    meanwhile: list[DatasetRef] = []
    for line in result.stdout.splitlines():
        state, _, slug = line.removeprefix(STATUS_PREFIX).partition(" ")
        if slug in by_slug:
            (staged if state == "staged" else meanwhile).append(by_slug[slug])
    return PushResult(remote_root, tuple(staged), tuple(present + meanwhile), len(archive), 2)


def job_data_setup(remote_root: str, task_dir: str) -> tuple[str, dict[str, str]]:
    """The shell prefix and environment of a task step that reads the staged cache `remote_root` (mounted
    read-only): datasets' Arrow cache is linked into a writable per-task directory (the library takes lock
    files next to it), the hub is switched off."""
    import shlex

    writable = posixpath.join(task_dir, "hf-datasets")
    prefix = (
        f"mkdir -p {shlex.quote(writable)} && "
        f"{{ [ ! -d {shlex.quote(remote_root + '/datasets')} ] || cp -rsf {shlex.quote(remote_root + '/datasets')}/. "
        f"{shlex.quote(writable)}/; }} && "
    )
    env = offline_env(remote_root)
    env["HF_DATASETS_CACHE"] = writable
    return prefix, env
