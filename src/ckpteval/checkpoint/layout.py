"""Where the pieces of a Megatron checkpoint are on disk (stdlib only, no torch).

The layout is Megatron-LM's, so a user's training checkpoint and one `evaluate prepare` wrote are
found the same way:

    <root>/latest_checkpointed_iteration.txt     "1000" or "release"
    <root>/iter_0001000/                         torch_dist: metadata.json, common.pt, .metadata, *.distcp
                                                 or legacy torch: mp_rank_00/model_optim_rng.pt (TP=PP=1)
    <root>/tokenizer/                            a Hugging Face tokenizer directory (ckpteval's convention;
                                                 <root>/iter_*/tokenizer/ is accepted too)

`common.pt` holds Megatron-LM's common state: `args` (the training arguments, from which the
architecture is read), `checkpoint_version` and `iteration`.

Megatron-Bridge writes the same weights but no `args`: its iteration directories hold
`run_config.yaml` instead, and its root a `latest_train_state.pt` tracker (releases since 0.2 also
write `latest_checkpointed_iteration.txt`). See `ckpteval.checkpoint.bridge`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ckpteval.checkpoint.bridge import TRAIN_STATE_TRACKER, is_bridge_checkpoint, read_train_state_step
from ckpteval.errors import DeploymentError

TRACKER_FILE = "latest_checkpointed_iteration.txt"
TOKENIZER_DIR = "tokenizer"
COMMON_STATE_FILE = "common.pt"
DIST_METADATA_FILE = "metadata.json"
DCP_METADATA_FILE = ".metadata"
CHECKPOINT_FORMAT = "torch_dist"
MEGATRON_LM = "megatron-lm"
MEGATRON_BRIDGE = "megatron-bridge"
LEGACY_FORMAT = "torch"
LEGACY_RANK_DIR = "mp_rank_00"  # the only rank of a legacy checkpoint saved with TP=1, PP=1, EP=1
LEGACY_STATE_FILE = "model_optim_rng.pt"

_ITER_DIR = re.compile(r"^iter_(\d+)$")


@dataclass(frozen=True)
class CheckpointLayout:
    """The directories of one checkpoint iteration."""

    root: Path
    iter_dir: Path
    iteration: int | None  # None for a "release" checkpoint
    tokenizer_dir: Path | None  # None when the checkpoint has no tokenizer beside it
    kind: str = MEGATRON_LM  # or MEGATRON_BRIDGE: the architecture is in run_config.yaml, not common.pt
    ckpt_format: str = CHECKPOINT_FORMAT  # or LEGACY_FORMAT: one mp_rank_00/model_optim_rng.pt


def legacy_state_file(iter_dir: Path) -> Path | None:
    """The one state file of a legacy `torch` checkpoint saved with TP=PP=1, else None."""
    path = iter_dir / LEGACY_RANK_DIR / LEGACY_STATE_FILE
    return path if path.is_file() and not (iter_dir / DIST_METADATA_FILE).is_file() else None


def iteration_dir_name(iteration: int | None) -> str:
    """Megatron-LM's directory name for an iteration: iter_0001000, or "release"."""
    return "release" if iteration is None else f"iter_{iteration:07d}"


def is_tokenizer_dir(path: Path) -> bool:
    """Whether `path` looks like a Hugging Face tokenizer directory.

    Megatron-LM's save_tokenizer_assets also writes <iter>/tokenizer/tokenizer.json for a TikTokenizer:
    Nemotron's vocabulary, a JSON list, which is not one.
    """
    if not path.is_dir():
        return False
    if (path / "tokenizer_config.json").is_file():
        return True
    tokenizer_json = path / "tokenizer.json"
    if not tokenizer_json.is_file():
        return False
    with open(tokenizer_json, "rb") as handle:
        return handle.read(64).lstrip()[:1] == b"{"


def locate_checkpoint(path: str | Path, *, pinned: str | None = None) -> CheckpointLayout:
    """Find the iteration directory and tokenizer of the checkpoint at `path` (a root or an iter_* dir).

    `pinned` ("1000" or "release": the iteration the job resolved when it described the checkpoint) is served
    whatever the tracker names now; DeploymentError when that iteration is gone (see `pinned_iteration_dir`).
    Raises DeploymentError naming the missing piece when `path` is not a readable torch_dist checkpoint.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise DeploymentError(
            f"Checkpoint {path} does not exist.",
            hint="Pass the checkpoint root (the directory with latest_checkpointed_iteration.txt) or an "
            "iter_NNNNNNN directory; `evaluate prepare tiny|smollm2` writes one.",
        )
    if not path.is_dir():
        raise DeploymentError(f"Checkpoint {path} is a file; a Megatron checkpoint is a directory.")
    path = path.resolve()

    if _ITER_DIR.match(path.name) or path.name == "release" or (path / DIST_METADATA_FILE).is_file():
        root, iter_dir = path.parent, path
        match = _ITER_DIR.match(path.name)
        iteration = int(match.group(1)) if match else None
    else:
        root = path
        iteration = _read_tracker(root) if pinned is None else parse_iteration(pinned)
        iter_dir = root / iteration_dir_name(iteration)
        if pinned is not None and not iter_dir.is_dir():
            raise pinned_iteration_gone(root, pinned)
        if not iter_dir.is_dir():
            raise DeploymentError(
                f"{root / TRACKER_FILE} names {iteration_dir_name(iteration)}, but {iter_dir} does not exist.",
                hint="The checkpoint is incomplete; point --checkpoint at an iteration directory that exists.",
            )
    if pinned is not None and iteration != parse_iteration(pinned):
        raise DeploymentError(
            f"{path} is iteration {iteration_label(iteration)}, but the job pinned iteration {pinned}.",
            hint="Pass the checkpoint root, or the pinned iteration's directory.",
        )
    ckpt_format = _checkpoint_format(iter_dir)
    tokenizer_dir = next((d for d in (iter_dir / TOKENIZER_DIR, root / TOKENIZER_DIR) if is_tokenizer_dir(d)), None)
    kind = MEGATRON_BRIDGE if is_bridge_checkpoint(iter_dir) else MEGATRON_LM
    return CheckpointLayout(
        root=root,
        iter_dir=iter_dir,
        iteration=iteration,
        tokenizer_dir=tokenizer_dir,
        kind=kind,
        ckpt_format=ckpt_format,
    )


def parse_iteration(text: str) -> int | None:
    """An iteration as a command line or the tracker writes it: a number, or "release" (None)."""
    text = text.strip()
    if text == "release":
        return None
    try:
        return int(text)
    except ValueError:
        raise DeploymentError(f"An iteration is a number or 'release', not {text[:40]!r}.") from None


def iteration_label(iteration: int | None) -> str:
    """The inverse of `parse_iteration`."""
    return "release" if iteration is None else str(iteration)


def pinned_iteration_gone(root: Path, pinned: str) -> DeploymentError:
    """The error of a job whose pinned iteration no longer exists (a training deleted or replaced it while
    the job waited), naming what the tracker says now."""
    try:
        now = f"; {TRACKER_FILE} now names {iteration_label(_read_tracker(root))}"
    except DeploymentError:
        now = ""
    return DeploymentError(
        f"The job serves iteration {pinned} of {root} (resolved when the checkpoint was described, before "
        f"submission), but {root / iteration_dir_name(parse_iteration(pinned))} no longer exists{now}.",
        hint="A training deleted or rewrote it while the job waited; submit again to evaluate what is there now.",
    )


def _read_tracker(root: Path) -> int | None:
    tracker = root / TRACKER_FILE
    if not tracker.is_file() and (root / TRAIN_STATE_TRACKER).is_file():  # Megatron-Bridge 0.1
        return read_train_state_step(root / TRAIN_STATE_TRACKER)
    if not tracker.is_file():
        found = sorted(
            p.name for p in root.iterdir() if p.is_dir() and (_ITER_DIR.match(p.name) or p.name == "release")
        )
        hint = (
            f"It has {', '.join(found[-3:])}: pass one of those directories instead."
            if found
            else "Pass a Megatron checkpoint root or iter_NNNNNNN directory; `evaluate prepare` writes one."
        )
        raise DeploymentError(
            f"{root} is not a Megatron checkpoint: {TRACKER_FILE} is missing "
            f"(and so is Megatron-Bridge's {TRAIN_STATE_TRACKER}).",
            hint=hint,
        )
    text = tracker.read_text().strip()
    if text == "release":
        return None
    try:
        return int(text)
    except ValueError:
        raise DeploymentError(f"{tracker} should hold an iteration number or 'release', not {text[:40]!r}.") from None


def _checkpoint_format(iter_dir: Path) -> str:
    """CHECKPOINT_FORMAT or LEGACY_FORMAT; DeploymentError for anything the server cannot read."""
    meta_file = iter_dir / DIST_METADATA_FILE
    if not meta_file.is_file():
        ranks = sorted(p.name for p in iter_dir.iterdir() if p.is_dir() and p.name.startswith("mp_rank_"))
        if ranks == [LEGACY_RANK_DIR]:
            if not (iter_dir / LEGACY_RANK_DIR / LEGACY_STATE_FILE).is_file():
                raise DeploymentError(
                    f"{iter_dir} is in Megatron's legacy 'torch' format, "
                    f"but {LEGACY_RANK_DIR} has no {LEGACY_STATE_FILE}."
                )
            return LEGACY_FORMAT
        if ranks:
            raise DeploymentError(
                f"{iter_dir} is in Megatron's legacy 'torch' format saved model-parallel ({', '.join(ranks[:4])}"
                + (", ..." if len(ranks) > 4 else "")
                + "); the builtin server reads legacy checkpoints saved with TP=1 and PP=1 only.",
                hint=legacy_conversion_hint(iter_dir, ranks),
            )
        raise DeploymentError(f"{iter_dir} is not a torch_dist checkpoint: {DIST_METADATA_FILE} is missing.")
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DeploymentError(f"{meta_file} cannot be read: {exc}") from None
    backend = meta.get("sharded_backend") if isinstance(meta, dict) else None
    if backend != CHECKPOINT_FORMAT:
        raise DeploymentError(
            f"{iter_dir} is a {backend!r} checkpoint; the builtin server reads {CHECKPOINT_FORMAT!r} only.",
            hint="Re-save it with Megatron-LM's --ckpt-format torch_dist.",
        )
    for name, what in ((COMMON_STATE_FILE, "the training args"), (DCP_METADATA_FILE, "the tensor index")):
        if not (iter_dir / name).is_file():
            raise DeploymentError(f"{iter_dir} is incomplete: {name} ({what}) is missing.")
    return CHECKPOINT_FORMAT


def legacy_conversion_hint(iter_dir: Path, ranks: list[str]) -> str:
    """How to turn a legacy checkpoint into torch_dist with Megatron-LM (its --ckpt-convert-format).

    The sizes come from the rank directories: mp_rank_TT (TP only) or mp_rank_TT_PPP.
    """
    tp = len({name.split("_")[2] for name in ranks})
    pp = len({name.split("_")[3] for name in ranks if name.count("_") >= 3}) or 1
    root = iter_dir.parent
    return (
        "Convert it to torch_dist with Megatron-LM on TP x PP = "
        f"{tp * pp} GPUs: torchrun --nproc-per-node {tp * pp} pretrain_gpt.py --use-checkpoint-args "
        f"--load {root} --ckpt-format torch --ckpt-convert-format torch_dist --ckpt-convert-save {root}-converted "
        f"--tensor-model-parallel-size {tp} --pipeline-model-parallel-size {pp} --no-load-optim --no-load-rng "
        "--mock-data (plus the training's tokenizer arguments); then serve "
        f"{root}-converted/torch_dist, which loads at any TP/PP."
    )
