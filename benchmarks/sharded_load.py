"""Sharded-load benchmark: serving a checkpoint saved with TP=2 against the TP=1 save of the same model.

The builtin server loads every torch_dist checkpoint at TP=1, so a TP=2 save is resharded by megatron's
loader (two half-shards per tensor read and stitched together). This measures what that costs, on the
CPU, with a model of SmolLM2-135M's size (random weights, fp32, 134M parameters; see
tests/support/corpus/sharded.py `sharded_architecture("bench")`), both checkpoints written by
megatron-core itself from the same weights (the TP=2 one resharded from the TP=1 one in a gloo world).

Each trial is a fresh process that does what `server.load_model` does, timing its phases:
  setup   imports, the single-rank runtime, reading common.pt, building the empty model
  load    `model.load_weights` (megatron's dist_checkpointing.load + load_state_dict)
and reports the peak RSS of the setup (ru_maxrss), the RSS just before the load, and the peak RSS
during the load (VmHWM after resetting it through /proc/self/clear_refs, so the setup's peak,
megatron's initialisation of the empty model, does not hide it). Trials alternate TP=1/TP=2 and which
goes first; the load average is printed with each. The weights loaded are compared once (bit-equal).

Run: `uv run python benchmarks/sharded_load.py [--repeats N] [--dir DIR]` (the checkpoints are built into
DIR once, ~1 GB, a few minutes). Results go into benchmarks/sharded_load.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TRIAL = r"""
import json, resource, sys, time
started = time.perf_counter()
from ckpteval.server.checkpoint import load_checkpoint_info
from ckpteval.server.model import build_gpt_model, load_weights
from ckpteval.server.runtime import init_runtime, quiet_library_logs
quiet_library_logs()
info = load_checkpoint_info(sys.argv[1])
runtime = init_runtime("cpu")
model = build_gpt_model(info.architecture, dtype=runtime.dtype)
setup = time.perf_counter() - started
setup_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def status(field):
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) / 1024
rss_before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current RSS: the next peak is the load's own
t = time.perf_counter()
load_weights(model, info.iter_dir)
load = time.perf_counter() - t
load_peak = status("VmHWM")
if len(sys.argv) > 2:
    import torch
    torch.save({k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}, sys.argv[2])
params = sum(p.numel() for p in model.parameters())
print(json.dumps({"setup_s": setup, "load_s": load, "setup_peak_mb": setup_peak, "rss_before_mb": rss_before,
                  "rss_peak_mb": load_peak, "params": params}))
"""


def trial(checkpoint: Path, dump: Path | None = None) -> dict[str, float]:
    """One fresh process loading `checkpoint` at TP=1; its timings, peak RSS and the load average."""
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    argv = [sys.executable, "-c", TRIAL, str(checkpoint), *([str(dump)] if dump else [])]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"trial on {checkpoint} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - started
    result["loadavg"] = (load_before + os.getloadavg()[0]) / 2
    return result


def checkpoint_mb(root: Path) -> float:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4, help="trials per checkpoint (alternating)")
    parser.add_argument("--skip-check", action="store_true", help="skip comparing the loaded weights")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "ckpteval-sharded-bench")
    options = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from tests.support.corpus.sharded import build_sharded

    names = ("tp1", "tp2")
    roots = {name: options.dir / name for name in names}
    if not all((root / "latest_checkpointed_iteration.txt").is_file() for root in roots.values()):
        started = time.perf_counter()
        print(f"building {names} (model 'bench') in {options.dir} ...", flush=True)
        build_sharded(options.dir, names, model="bench")
        print(f"built in {time.perf_counter() - started:.0f} s", flush=True)
    for name, root in roots.items():
        shards = len(list((root / "iter_0000000").glob("*.distcp")))
        print(f"{name}: {checkpoint_mb(root):.0f} MiB on disk, {shards} .distcp file(s)")

    # Once: both load to the same weights.
    import torch

    with tempfile.TemporaryDirectory() as scratch:
        if options.skip_check:
            names_checked: tuple[str, ...] = ()
        else:
            names_checked = names
        dumps = {name: Path(scratch) / f"{name}.pt" for name in names}
        for name in names_checked:
            trial(roots[name], dumps[name])
        if names_checked:
            a, b = (torch.load(dumps[name]) for name in names)
            equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
            print(f"weights loaded from tp1 and tp2 bit-equal: {equal}")

    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    print(f"\nload average at start: {os.getloadavg()}, cpus: {os.cpu_count()}")
    header = ("trial", "ckpt", "setup s", "load s", "process s", "setup peak", "RSS before", "load peak", "loadavg")
    print(" ".join(f"{h:>10}" for h in header))
    for repeat in range(options.repeats):
        order = names if repeat % 2 == 0 else names[::-1]
        for name in order:
            r = trial(roots[name])
            results[name].append(r)
            print(
                f"{repeat:>10} {name:>10} {r['setup_s']:>10.2f} {r['load_s']:>10.2f} {r['process_s']:>10.2f} "
                f"{r['setup_peak_mb']:>8.0f}MB {r['rss_before_mb']:>8.0f}MB {r['rss_peak_mb']:>8.0f}MB "
                f"{r['loadavg']:>10.2f}",
                flush=True,
            )

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    print("\n| measure (median) | TP=1 save | TP=2 save | TP=2 / TP=1 |")
    print("|---|---|---|---|")
    for key, label in (
        ("load_s", "load_weights, s"),
        ("setup_s", "setup (imports, runtime, empty model), s"),
        ("process_s", "whole process, s"),
        ("setup_peak_mb", "peak RSS of the setup, MB"),
        ("rss_before_mb", "RSS before the load, MB"),
        ("rss_peak_mb", "peak RSS during the load, MB"),
    ):
        one, two = median("tp1", key), median("tp2", key)
        print(f"| {label} | {one:.2f} | {two:.2f} | {two / one:.2f} |")
    growth = {name: median(name, "rss_peak_mb") - median(name, "rss_before_mb") for name in names}
    print(
        f"| peak RSS added by the load, MB | {growth['tp1']:.0f} | {growth['tp2']:.0f} | "
        f"{growth['tp2'] / max(growth['tp1'], 1):.2f} |"
    )
    print(f"\nparameters: {results['tp1'][0]['params']:,}; load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
