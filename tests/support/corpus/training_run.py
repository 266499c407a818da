"""A training run's save directory with two (or more) iterations of different weights, written by megatron-core.

    <root>/iter_0000001/   the tiny model (its packaged seed)
    <root>/iter_0000002/   the same model one "step" later: every weight moved (seeded noise)
    <root>/iter_0000003/   (steps=3) one step further, as many as `steps`
    <root>/tokenizer/      the byte tokenizer
    <root>/latest_checkpointed_iteration.txt   the last step

Both saves go through `ckpteval.server.model.save_checkpoint` (megatron-core's `dist_checkpointing.save`,
torch_dist, the tracker written as Megatron-LM does), so their file lists and sizes are identical and only
their bytes differ: what a training that saves while a job waits looks like.

    python -m tests.support.corpus.training_run ROOT [STEPS]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def build_training_run(root: Path, steps: int = 2) -> Path:
    """Write the run's `steps` iterations into `root` (a child process: the writer forks); returns `root`."""
    repo = Path(__file__).resolve().parents[3]
    command = [sys.executable, "-m", "tests.support.corpus.training_run", str(root), str(steps)]
    subprocess.run(command, check=True, cwd=repo)
    return root


def set_tracker(root: Path, iteration: int) -> None:
    """Point the run's tracker at `iteration`, as a training's next save does."""
    from ckpteval.checkpoint.layout import TRACKER_FILE

    (root / TRACKER_FILE).write_text(str(iteration))


def _main(root: Path, steps: int) -> None:
    import torch

    from ckpteval.server.model import build_gpt_model, save_checkpoint
    from ckpteval.server.packaged import TINY_ARCHITECTURE, TINY_INIT_STD, TINY_SEED
    from ckpteval.server.runtime import init_runtime
    from ckpteval.server.tokenizer import write_byte_tokenizer

    init_runtime("cpu")
    torch.manual_seed(TINY_SEED)
    model = build_gpt_model(TINY_ARCHITECTURE, initialize=True, init_std=TINY_INIT_STD)
    root.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(root / "tokenizer")

    def args():  # type: ignore[no-untyped-def]
        return TINY_ARCHITECTURE.to_args(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=None, vocab_size=257)

    save_checkpoint(model, root, args=args(), iteration=1)
    generator = torch.Generator().manual_seed(2)
    for iteration in range(2, steps + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * TINY_INIT_STD)
        save_checkpoint(model, root, args=args(), iteration=iteration)


if __name__ == "__main__":
    _main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2)
