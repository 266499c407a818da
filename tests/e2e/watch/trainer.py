"""A stand-in for a Megatron training run: saves the tiny model as iter 10, 20, 30, 40 over time.

    python trainer.py SAVE_DIR GO_FILE

Every save is written by the project's own checkpoint writer (megatron-core's `dist_checkpointing.save`,
torch_dist, through `ckpteval.server.model.save_checkpoint`, which also writes the tracker file as
Megatron-LM does). To be seen half-written, a save is first written to a staging dir and its files are
then moved into `SAVE_DIR/iter_NNNNNNN` in the order the writer produces them: `common.pt` and the
`*.distcp` shards, then `.metadata`, then `metadata.json`, then the tracker.

- iter 10: saved in place, complete.
- iter 20: shards and common.pt moved in; the trainer prints "HALF 20" and waits for GO_FILE; then
  `.metadata`, `metadata.json` and the tracker follow (a slow save, complete in the end).
- iter 30: shards and common.pt moved in, then the "training crashes": never completed.
- iter 40: saved in place, complete (the training restarted and went on).

Prints "SAVED N" when iteration N is complete, "DONE" at the end.

    python trainer.py --chaos SAVE_DIR GAP_S [LAST]

The chaos test's training: six saves, GAP_S seconds apart, on its own (no GO_FILE): 10 complete; 20
half-written first (complete GAP_S/3 later); 30 complete; 40 crashed half-way (never completed); 50
half-written first; 60 complete. With LAST, it ends after iteration LAST. Let it end by itself: the
checkpoint writer's helper processes outlive a trainer that is killed.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path


def _move(staging: Path, iter_dir: Path, names: list[str]) -> None:
    for name in names:
        shutil.move(str(staging / name), str(iter_dir / name))


def main(save_dir: Path, go_file: Path | None, gap: float = 0.0, last: int = 60) -> None:
    import torch

    from ckpteval.checkpoint.layout import TRACKER_FILE, iteration_dir_name
    from ckpteval.server.model import build_gpt_model, save_checkpoint
    from ckpteval.server.packaged import TINY_ARCHITECTURE, TINY_INIT_STD, TINY_SEED
    from ckpteval.server.runtime import init_runtime
    from ckpteval.server.tokenizer import write_byte_tokenizer

    init_runtime("cpu")
    torch.manual_seed(TINY_SEED)
    model = build_gpt_model(TINY_ARCHITECTURE, initialize=True, init_std=TINY_INIT_STD)
    save_dir.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(save_dir / "tokenizer")

    def args():
        return TINY_ARCHITECTURE.to_args(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=None, vocab_size=257)

    def train_a_bit() -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.01)

    def staged(iteration: int) -> tuple[Path, Path, list[str]]:
        staging = save_dir.parent / f".staging-{iteration}"
        save_checkpoint(model, staging, args=args(), iteration=iteration)
        src = staging / iteration_dir_name(iteration)
        dst = save_dir / iteration_dir_name(iteration)
        dst.mkdir()
        shards = sorted(p.name for p in src.iterdir() if p.suffix == ".distcp")
        _move(src, dst, ["common.pt", *shards])
        return src, dst, shards

    def complete(src: Path, dst: Path, iteration: int) -> None:
        _move(src, dst, [".metadata"])
        time.sleep(0.3)
        _move(src, dst, ["metadata.json"])
        (save_dir / TRACKER_FILE).write_text(str(iteration))
        print(f"SAVED {iteration}", flush=True)

    if go_file is None:  # --chaos: six saves on a timer
        for iteration in (i for i in (10, 20, 30, 40, 50, 60) if i <= last):
            if iteration > 10:
                time.sleep(gap)
            train_a_bit()
            if iteration in (10, 30, 60):
                save_checkpoint(model, save_dir, args=args(), iteration=iteration)
                print(f"SAVED {iteration}", flush=True)
                continue
            src, dst, _ = staged(iteration)
            if iteration == 40:
                print("CRASHED 40", flush=True)  # never completed; the training goes on from a restart
                continue
            print(f"HALF {iteration}", flush=True)
            time.sleep(gap / 3)
            complete(src, dst, iteration)
        print("DONE", flush=True)
        return

    train_a_bit()
    save_checkpoint(model, save_dir, args=args(), iteration=10)
    print("SAVED 10", flush=True)

    train_a_bit()
    src, dst, _ = staged(20)
    print("HALF 20", flush=True)
    while not go_file.exists():
        time.sleep(0.1)
    complete(src, dst, 20)

    train_a_bit()
    staged(30)  # ... and the training dies here: no .metadata, no metadata.json, no tracker update
    print("CRASHED 30", flush=True)

    train_a_bit()
    save_checkpoint(model, save_dir, args=args(), iteration=40)
    print("SAVED 40", flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--chaos":
        main(Path(sys.argv[2]), None, float(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 60)
    else:
        main(Path(sys.argv[1]), Path(sys.argv[2]))
