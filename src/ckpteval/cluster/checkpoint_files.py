"""A cluster checkpoint's small files, brought here in one round trip so it can be described before submission.

One remote shell command finds the iteration directory (as `checkpoint.layout` does: an iteration directory
itself, the tracker's iteration, else the newest `iter_*`) and writes a gzipped tar of the files a
description reads: the trackers, `common.pt`, the torch_dist index (`.metadata`, `metadata.json`),
Megatron-Bridge's `run_config.yaml`, the tokenizer directories and a Hugging Face `config.json`; never a
weight shard (a Hugging Face directory's weight files come back as their sizes). The tar comes back
base64-encoded on stdout and is unpacked into a local directory with the same relative layout, so
`describe_checkpoint` reads it like a local checkpoint. The iteration directory's file list (names and sizes)
comes back too, for the checkpoint's identity (`checkpoint.identity`).
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import base64
import binascii
import dataclasses
import io
import tarfile
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from ckpteval.errors import ClusterError, DeploymentError

if TYPE_CHECKING:
    from ckpteval.checkpoint.description import CheckpointDescription
    from ckpteval.cluster.remote import Remote
    from ckpteval.config.profiles import Profile

MAX_FILE_MB = 64  # a tokenizer.json or a big model's tensor index fits; a weight shard never does
_MISSING = "ckpteval-checkpoint-missing"

# $1: the checkpoint path. Prints base64 of a tar.gz of the small files, relative to the root.
_SCRIPT = r"""
p=$1
[ -e "$p" ] || { echo @MISSING@; exit 3; }
[ -d "$p" ] || { echo ckpteval-checkpoint-file; exit 4; }
cd "$p" || exit 5
it=
case "$(basename "$(pwd)")" in iter_*|release) it=$(basename "$(pwd)"); cd ..;; esac
if [ -z "$it" ] && [ -f metadata.json ] && [ -f common.pt ]; then it=$(basename "$(pwd)"); cd ..; fi
if [ -z "$it" ] && [ -f latest_checkpointed_iteration.txt ]; then
  n=$(tr -d ' \n' < latest_checkpointed_iteration.txt)
  case "$n" in release) it=release;; *[!0-9]*|'') it=;; *) it=$(printf 'iter_%07d' "$n");; esac
fi
[ -n "$it" ] || it=$(ls -d iter_* 2>/dev/null | sort | tail -1)
files=
for f in latest_checkpointed_iteration.txt latest_train_state.pt config.json generation_config.json \
  tokenizer.json tokenizer_config.json special_tokens_map.json vocab.json merges.txt tokenizer.model; do
  [ -f "$f" ] && files="$files $f"
done
if [ -n "$it" ]; then
  for f in common.pt metadata.json .metadata run_config.yaml train_state.pt; do
    [ -f "$it/$f" ] && files="$files $it/$f"
  done
  ls -d "$it"/mp_rank_* >/dev/null 2>&1 && files="$files $(ls -d "$it"/mp_rank_* | head -1)"
fi
for d in tokenizer "$it/tokenizer"; do
  [ -d "$d" ] && files="$files $(find "$d" -maxdepth 1 -type f -size -@MAX_MB@M | tr '\n' ' ')"
done
tar -czf - --no-recursion $files 2>/dev/null | base64 -w0
echo
for w in *.safetensors *.bin; do [ -f "$w" ] && echo "WEIGHTS $(wc -c < "$w") $w"; done
[ -n "$it" ] && [ -d "$it" ] && find "$it" -type f ! -path "$it/tokenizer/*" -printf 'FILE %s %P\n'
echo "ITER=$it"
""".replace("@MISSING@", _MISSING).replace("@MAX_MB@", str(MAX_FILE_MB))


def fetch_checkpoint_files(remote: Remote, path: str, into: Path) -> tuple[Path, list[tuple[str, int]]]:
    """Copy the small files of the checkpoint at `path` on the cluster into `into`; return the local path
    that stands for `path` (the root, or the iteration directory when `path` named one), and the iteration
    directory's files with their sizes (as `checkpoint.identity.list_files` lists them).

    One remote command. Raises DeploymentError when `path` does not exist there or is not a directory.
    """
    result = remote.run(["sh", "-c", _SCRIPT, "sh", path], check=False, timeout=120)
    out = result.stdout.strip().splitlines()
    if out and out[0] == _MISSING:
        raise DeploymentError(
            f"Checkpoint {path} does not exist on {remote.description}.",
            hint="Pass run.model=/path/on/the/cluster (the checkpoint root or an iter_NNNNNNN directory).",
        )
    if out and out[0] == "ckpteval-checkpoint-file":
        raise DeploymentError(
            f"Checkpoint {path} on {remote.description} is a file; a Megatron checkpoint is a directory."
        )
    if not result.ok or len(out) < 2 or not out[-1].startswith("ITER="):
        detail = (result.stderr.strip() or result.stdout.strip())[-500:]
        raise ClusterError(f"Could not read checkpoint {path} on {remote.description}: {detail}")
    try:
        archive = base64.b64decode(out[0]) if out[0] else b""
    except binascii.Error as exc:
        raise ClusterError(
            f"The files of checkpoint {path} came back garbled from {remote.description}: {exc}"
        ) from None
    iteration = out[-1].removeprefix("ITER=")
    root = into / "checkpoint"
    root.mkdir(parents=True, exist_ok=True)
    if archive:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            tar.extractall(root, filter="data")  # refuses absolute paths and '..'
    listing: list[tuple[str, int]] = []
    for line in out[1:-1]:  # a Hugging Face directory's weights: sparse stand-ins of their size
        kind, size, name = line.split(" ", 2)
        if kind == "FILE":
            listing.append((name, int(size)))
        elif "/" not in name:
            with open(root / name, "wb") as stand_in:
                stand_in.truncate(int(size))
    named = PurePosixPath(path)
    if iteration and named.name == iteration:
        return root / iteration, listing
    return root, listing


def describe_remote_checkpoint(
    remote: Remote, path: str, *, tokenizer: str | None = None, origin: str | None = None
) -> CheckpointDescription:
    """`describe_checkpoint` of a checkpoint on the cluster, from its small files (see the module docstring).

    Paths in the description are the cluster's. `origin` (deployment.origin) is read on this machine: a
    Hugging Face directory here or a hub id in the local cache."""
    import tempfile

    from ckpteval.checkpoint.description import describe_checkpoint, with_paths_replaced

    with tempfile.TemporaryDirectory(prefix="ckpteval-inspect-") as tmp:
        local, listing = fetch_checkpoint_files(remote, path, Path(tmp))
        description = describe_checkpoint(local, tokenizer=tokenizer, origin=origin)
        if description.identity is not None:  # the shards are there, not here: their names and sizes
            from ckpteval.checkpoint.identity import checkpoint_identity
            from ckpteval.checkpoint.layout import locate_checkpoint

            identity = checkpoint_identity(locate_checkpoint(local).iter_dir, listing)
            description = dataclasses.replace(description, identity=identity)
        return with_paths_replaced(description, str(local), str(PurePosixPath(path)))


def describe_at(profile: Profile, path: str, *, tokenizer: str | None, origin: str | None) -> CheckpointDescription:
    """The checkpoint at `path` on the machine `profile` reaches (its small files in one round trip, over a
    connection opened and closed here, reopened if it drops)."""
    from ckpteval.cluster.session import ClusterSession

    with ClusterSession(profile) as session:
        return session.call(lambda remote: describe_remote_checkpoint(remote, path, tokenizer=tokenizer, origin=origin))
