"""A checkpoint loaded to serve: its architecture (from the args in common.pt), its tensors' shapes and the
tokenizer it is served with.

Needs torch (common.pt is a torch pickle and the torch_dist index a torch object) but not megatron. What is
read before submission, without torch, is in `ckpteval.checkpoint` (`checkpoint.args`, `checkpoint.description`).
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import importlib
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.checkpoint.architecture import ModelArchitecture
from ckpteval.checkpoint.args import EMBEDDING_KEY, read_training_args
from ckpteval.checkpoint.layout import COMMON_STATE_FILE, CheckpointLayout, legacy_state_file, locate_checkpoint
from ckpteval.errors import DeploymentError

# Classes common.pt may contain that are safe to rebuild: Megatron-LM pickles its argparse
# namespace, paths, dtypes and megatron enums there. Anything else is refused, not executed.
_TRUSTED_MODULES = ("argparse", "pathlib", "types", "enum", "collections", "numpy", "torch", "megatron", "signal", "io")


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint ready to serve: its layout, the model architecture and the tokenizer directory."""

    layout: CheckpointLayout
    architecture: ModelArchitecture
    tokenizer_dir: Path
    args: Any  # the Megatron-LM args namespace as stored

    @property
    def iter_dir(self) -> Path:
        return self.layout.iter_dir

    @property
    def root(self) -> Path:
        return self.layout.root


def read_common_state(iter_dir: Path) -> dict[str, Any]:
    """The common (non-sharded) state of a checkpoint: args, iteration, checkpoint_version.

    For a legacy `torch` checkpoint that is its one mp_rank_00/model_optim_rng.pt, whose "model"
    state dict is memory-mapped: the weights are read only where they are used.
    """
    import torch

    path = legacy_state_file(iter_dir) or iter_dir / COMMON_STATE_FILE
    allowed = []
    try:
        for name in torch.serialization.get_unsafe_globals_in_checkpoint(str(path)):
            module, _, attr = name.rpartition(".")
            if module.split(".")[0] not in _TRUSTED_MODULES:
                raise DeploymentError(
                    f"{path} contains a {name} object; ckpteval loads only args, tensors and megatron types from it.",
                )
            allowed.append(getattr(importlib.import_module(module), attr))
        with torch.serialization.safe_globals(allowed):
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except (OSError, RuntimeError, pickle.UnpicklingError, ImportError, AttributeError) as exc:
        raise DeploymentError(f"{path} cannot be read: {exc}") from None
    if not isinstance(state, dict):
        raise DeploymentError(f"{path} does not hold a state dict (found {type(state).__name__}).")
    return state


def checkpoint_tensor_shapes(iter_dir: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> global shape, from the torch_dist index (reads no weights).

    For a legacy checkpoint: the shapes in its state dict, under its own (per-layer) names.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if legacy_state_file(iter_dir) is not None:
        return {key: tuple(value.shape) for key, value in legacy_model_state(iter_dir).items()}
    try:
        metadata = FileSystemReader(str(iter_dir)).read_metadata()
    except (OSError, RuntimeError, pickle.UnpicklingError) as exc:
        raise DeploymentError(f"The tensor index of {iter_dir} cannot be read: {exc}") from None
    return {
        key: tuple(meta.size)
        for key, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata)
    }


def legacy_model_state(iter_dir: Path) -> dict[str, Any]:
    """The tensors of a legacy TP=1 checkpoint's "model" state dict (memory-mapped), by name."""
    import torch

    model = read_common_state(iter_dir).get("model")
    if not isinstance(model, dict):
        raise DeploymentError(f"{legacy_state_file(iter_dir)} has no 'model' state dict.")
    return {key: value for key, value in model.items() if isinstance(value, torch.Tensor)}


def load_checkpoint_info(
    path: str | Path, *, tokenizer: str | None = None, pinned: str | None = None
) -> CheckpointInfo:
    """Read a checkpoint's architecture and find its tokenizer; DeploymentError says what is missing.

    `path` is the checkpoint root or an iter_* directory. `tokenizer` (a Hugging Face directory or hub
    id) overrides the tokenizer; else <iter>/tokenizer, <root>/tokenizer, or what the args name
    (ckpteval.checkpoint.tokenizer_source). `pinned`: the iteration to read whatever the tracker names now
    (`ckpteval.checkpoint.layout.locate_checkpoint`).
    """
    layout = locate_checkpoint(path, pinned=pinned)
    args, _, _ = read_training_args(layout)
    vocab = checkpoint_tensor_shapes(layout.iter_dir).get(EMBEDDING_KEY, (None,))[0]
    architecture = ModelArchitecture.from_args(args, where=str(layout.iter_dir), vocab_from_weights=vocab)
    return CheckpointInfo(
        layout=layout,
        architecture=architecture,
        tokenizer_dir=_find_tokenizer(layout, args, tokenizer, architecture.padded_vocab_size),
        args=args,
    )


def _find_tokenizer(layout: CheckpointLayout, args: Any, override: str | Path | None, padded_vocab_size: int) -> Path:
    """The Hugging Face tokenizer directory to serve with: `override`, the checkpoint's, or what its args name
    (converted once and cached); its vocabulary must fit the model's."""
    from ckpteval.checkpoint.tokenizer_convert import materialize_tokenizer
    from ckpteval.checkpoint.tokenizer_source import check_vocab_fits, tokenizer_source

    directory = materialize_tokenizer(tokenizer_source(args, layout, override))
    check_vocab_fits(directory, padded_vocab_size, where=str(layout.iter_dir))
    return directory


def publish_tokenizer(
    checkpoint: str | Path, target: Path, *, tokenizer: str | None = None, pinned: str | None = None
) -> Path:
    """Write the tokenizer the server serves `checkpoint` with to `target`, as a Hugging Face directory (the
    task clients read it there, so both tokenize alike): its tokenizer files only, never a model's weights
    (`deployment.tokenizer` may name a whole Hugging Face model directory). Written beside `target` and
    renamed into place."""
    import os
    import shutil
    import tempfile

    from ckpteval.checkpoint.tokenizer_source import tokenizer_files

    info = load_checkpoint_info(checkpoint, tokenizer=tokenizer, pinned=pinned)
    source = info.tokenizer_dir
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        for item in tokenizer_files(source):
            shutil.copy2(item, staging / item.name)
        staging.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
