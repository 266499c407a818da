"""What a checkpoint holds: its architecture (from the args in common.pt) and where its tokenizer is.

Needs torch (common.pt is a torch pickle) but not megatron, so validating a checkpoint is quick.
"""

from __future__ import annotations

import importlib
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ckpteval.deploy.architecture import ModelArchitecture
from ckpteval.deploy.layout import (
    COMMON_STATE_FILE,
    TOKENIZER_DIR,
    CheckpointLayout,
    is_tokenizer_dir,
    legacy_state_file,
    locate_checkpoint,
)
from ckpteval.errors import DeploymentError

EMBEDDING_KEY = "embedding.word_embeddings.weight"

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


class SavedParallelism(NamedTuple):
    """The model-parallel sizes a checkpoint was saved with; None where neither args nor index say.

    `vp` is 1 when the args record no virtual pipeline. The builtin server loads any of these at
    TP=PP=EP=1: megatron's torch_dist loader reshards.
    """

    tp: int | None
    pp: int | None
    ep: int | None
    vp: int | None


_PARALLEL_ARGS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
)


def saved_parallelism(args: Any, iter_dir: Path) -> SavedParallelism:
    """TP, PP, EP and VP of a saved checkpoint, from Megatron-LM's args (as common.pt stores them).

    Args without the sizes (None, or a namespace from another layout) fall back to the torch_dist
    index, which tells TP only: the vocabulary-parallel embedding is stored as one chunk per TP rank.
    PP, EP and VP leave no trace in the index (layers and experts are stored one chunk each).
    """
    recorded = {name: getattr(args, name, None) for name in _PARALLEL_ARGS}
    if recorded["tensor_model_parallel_size"] is not None:
        return SavedParallelism(
            tp=int(recorded["tensor_model_parallel_size"]),
            pp=int(recorded["pipeline_model_parallel_size"] or 1),
            ep=int(recorded["expert_model_parallel_size"] or 1),
            vp=int(recorded["virtual_pipeline_model_parallel_size"] or 1),
        )
    return SavedParallelism(tp=_tp_from_index(iter_dir), pp=None, ep=None, vp=None)


def _tp_from_index(iter_dir: Path) -> int | None:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        metadata = FileSystemReader(str(iter_dir)).read_metadata()
    except (OSError, RuntimeError, pickle.UnpicklingError):
        return None
    embedding = metadata.state_dict_metadata.get(EMBEDDING_KEY)
    if not isinstance(embedding, TensorStorageMetadata):
        return None
    return len({chunk.offsets[0] for chunk in embedding.chunks})


def load_checkpoint_info(path: str | Path, *, tokenizer: str | Path | None = None) -> CheckpointInfo:
    """Read a checkpoint's architecture and find its tokenizer; DeploymentError says what is missing.

    `path` is the checkpoint root or an iter_* directory. `tokenizer` overrides the tokenizer
    directory (default: <root>/tokenizer, <iter>/tokenizer, or the args' tokenizer_model if local).
    """
    layout = locate_checkpoint(path)
    common = read_common_state(layout.iter_dir)
    args = common.get("args")
    if args is None:
        raise DeploymentError(
            f"{layout.iter_dir / COMMON_STATE_FILE} has no 'args', so the model's architecture is unknown.",
            hint="Megatron-LM stores its training args there; save the checkpoint with Megatron-LM or "
            "re-create it with `evaluate prepare`.",
        )
    vocab = checkpoint_tensor_shapes(layout.iter_dir).get(EMBEDDING_KEY, (None,))[0]
    architecture = ModelArchitecture.from_args(args, where=str(layout.iter_dir), vocab_from_weights=vocab)
    return CheckpointInfo(
        layout=layout,
        architecture=architecture,
        tokenizer_dir=_find_tokenizer(layout, args, tokenizer),
        args=args,
    )


def _find_tokenizer(layout: CheckpointLayout, args: Any, override: str | Path | None) -> Path:
    if override is not None:
        path = Path(override).expanduser()
        if not is_tokenizer_dir(path):
            raise DeploymentError(f"--tokenizer {path} is not a Hugging Face tokenizer directory.")
        return path.resolve()
    if layout.tokenizer_dir is not None:
        return layout.tokenizer_dir
    model = getattr(args, "tokenizer_model", None)
    if isinstance(model, str) and is_tokenizer_dir(Path(model)):
        return Path(model).resolve()
    raise DeploymentError(
        f"The checkpoint has no tokenizer: {layout.root / TOKENIZER_DIR} is missing"
        + (f" and its tokenizer_model {model!r} is not a local directory." if model else "."),
        hint="Save the model's Hugging Face tokenizer there "
        f"(tokenizer.save_pretrained('{layout.root / TOKENIZER_DIR}')) or pass --tokenizer DIR.",
    )
