"""Which checkpoints of a Megatron save directory are completely written, in one listing per poll.

Megatron-LM (megatron.core.dist_checkpointing.save, torch_dist format) writes an iteration in this order:
`common.pt` (the common state), the `*.distcp` shards, `.metadata` (the tensor index, written by torch's
DCP when every shard is done), then `metadata.json` (the format marker, in the save's finalize step);
only after that does the training write `latest_checkpointed_iteration.txt`. So an `iter_NNNNNNN` dir is
ready when all three markers are there; a save that crashed half-way lacks `.metadata` or
`metadata.json` and is never ready (nor evaluated) until a later save completes it.

The listing is ONE shell command (POSIX sh, no Python needed on the cluster) that reports every
iteration dir with the markers it holds, the modification times of its markers (its `save` signature: a
restarted or rolled-back training that rewrites `iter_N` changes it, and the watcher evaluates it again), and
the tracker's content; run through a `Remote` it costs one SSH round trip per poll, however many checkpoints
there are. The same command runs here for local dirs.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass

from ckpteval.checkpoint.layout import COMMON_STATE_FILE, DCP_METADATA_FILE, DIST_METADATA_FILE, TRACKER_FILE
from ckpteval.cluster.remote import Remote
from ckpteval.errors import ClusterError, ConfigError

MARKERS = (COMMON_STATE_FILE, DCP_METADATA_FILE, DIST_METADATA_FILE)
_ITER = re.compile(r"^iter_(\d+)$")


@dataclass(frozen=True)
class CheckpointStatus:
    """One iteration directory as the listing saw it."""

    iteration: int
    path: str  # the iter_NNNNNNN directory
    markers: frozenset[str]
    tracker_reached: bool  # latest_checkpointed_iteration.txt names this iteration or a later one
    save: str = ""  # its markers' modification times: another save of the same iteration changes it

    @property
    def ready(self) -> bool:
        """Completely written: every torch_dist marker is there (Megatron writes metadata.json last)."""
        return all(m in self.markers for m in MARKERS)

    @property
    def missing(self) -> list[str]:
        return [m for m in MARKERS if m not in self.markers]


@dataclass(frozen=True)
class SaveDirListing:
    """A save directory at one moment: its iterations (ascending) and the tracker's content."""

    save_dir: str
    exists: bool
    tracker: str | None  # the tracker file's text ("1000", "release"), None when absent
    checkpoints: tuple[CheckpointStatus, ...]

    @property
    def ready(self) -> list[CheckpointStatus]:
        return [c for c in self.checkpoints if c.ready]

    @property
    def incomplete(self) -> list[CheckpointStatus]:
        return [c for c in self.checkpoints if not c.ready]


def listing_command(save_dir: str) -> str:
    """The one shell command that lists `save_dir`: a `tracker` line, then `dir NAME MARKER...` lines."""
    tests = " ".join(f'[ -f "$d/{m}" ] && m="$m {m}";' for m in MARKERS)
    times = " ".join(f'"$d/{m}"' for m in MARKERS)
    return (
        f"cd -- {shlex.quote(save_dir)} 2>/dev/null || {{ echo missing; exit 0; }}; "
        f"echo present; "
        f"if [ -f {TRACKER_FILE} ]; then printf 'tracker %s\\n' \"$(head -c 64 {TRACKER_FILE})\"; fi; "
        f'for d in iter_*; do [ -d "$d" ] || continue; m=""; {tests} printf \'dir %s%s\\n\' "$d" "$m"; '
        f"s=$(stat -c %Y.%s {times} 2>/dev/null | tr '\\n' ,); printf 'save %s %s\\n' \"$d\" \"$s\"; done"
    )


def parse_listing(save_dir: str, output: str) -> SaveDirListing:
    """The listing command's output as a `SaveDirListing`."""
    lines = output.splitlines()
    if not lines or lines[0].strip() == "missing":
        return SaveDirListing(save_dir=save_dir, exists=False, tracker=None, checkpoints=())
    tracker: str | None = None
    found: list[tuple[int, str, frozenset[str]]] = []
    saves: dict[str, str] = {}
    for line in lines[1:]:
        kind, _, rest = line.partition(" ")
        if kind == "tracker":
            tracker = rest.strip()
        elif kind == "save":
            name, _, signature = rest.partition(" ")
            saves[name] = signature.strip()
        elif kind == "dir":
            name, *markers = rest.split()
            match = _ITER.match(name)
            if match:
                found.append((int(match.group(1)), name, frozenset(markers)))
    latest = int(tracker) if tracker and tracker.isdigit() else None
    checkpoints = tuple(
        CheckpointStatus(
            iteration=iteration,
            path=posixpath.join(save_dir, name),
            markers=markers,
            tracker_reached=latest is not None and latest >= iteration,
            save=saves.get(name, ""),
        )
        for iteration, name, markers in sorted(found)
    )
    return SaveDirListing(save_dir=save_dir, exists=True, tracker=tracker, checkpoints=checkpoints)


def list_save_dir(remote: Remote, save_dir: str, *, timeout: float = 60.0) -> SaveDirListing:
    """List `save_dir` where `remote` runs commands: one command, one round trip."""
    if not save_dir.startswith("/"):
        raise ConfigError(f"The save directory must be an absolute path, not {save_dir!r}.")
    result = remote.run(listing_command(save_dir), timeout=timeout, check=False)
    if not result.ok:
        raise ClusterError(
            f"Listing {save_dir} on {remote.description} failed (exit {result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[:300]}"
        )
    return parse_listing(save_dir, result.stdout)
