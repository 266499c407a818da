"""A checkpoint's training args, read without torch: Megatron-LM's from common.pt, Megatron-Bridge's from its
run_config.yaml (stdlib only)."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from typing import Any

from ckpteval.checkpoint.bridge import bridge_args, hf_model_id
from ckpteval.checkpoint.layout import COMMON_STATE_FILE, MEGATRON_BRIDGE, CheckpointLayout, legacy_state_file
from ckpteval.errors import DeploymentError

EMBEDDING_KEY = "embedding.word_embeddings.weight"  # the word embeddings' name in the torch_dist index


def read_training_args(layout: CheckpointLayout) -> tuple[Any, str, str | None]:
    """(args under Megatron-LM's names, the layout kind, the Hugging Face id it started from) of a checkpoint.

    Megatron-LM pickles its args into common.pt (read without torch: `checkpoint.torchfiles`); Megatron-Bridge
    writes none there and keeps its configuration in run_config.yaml (`checkpoint.bridge`). Raises
    DeploymentError when no args are found.
    """
    from ckpteval.checkpoint.torchfiles import read_torch_save

    path = legacy_state_file(layout.iter_dir) or layout.iter_dir / COMMON_STATE_FILE  # legacy: only its pickle
    common = read_torch_save(path)
    if not isinstance(common, dict):
        raise DeploymentError(f"{path} does not hold a state dict.")
    args = common.get("args")
    if args is None and layout.kind == MEGATRON_BRIDGE:
        args = bridge_args(layout.iter_dir)
    if args is None:
        raise DeploymentError(
            f"{path} has no 'args', so the model's architecture is unknown.",
            hint="Megatron-LM stores its training args there; save the checkpoint with Megatron-LM or "
            "re-create it with `evaluate prepare`.",
        )
    started_from = hf_model_id(layout.iter_dir) if layout.kind == MEGATRON_BRIDGE else None
    return args, layout.kind, started_from
