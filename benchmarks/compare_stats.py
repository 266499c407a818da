"""The bootstrap of `evaluate compare`: drawing counts of distinct differences against drawing documents.

Side by side in one run (interleaved, CPU time, median of N), for 0/1 scores (differences -1, 0, +1) at
MMLU sizes: `ckpteval.results.stats.bootstrap_ci` (multinomial counts) against the index bootstrap it
replaced (`integers(0, n, size=(chunk, n))`, the same chunking), both 10,000 resamples. Also the
permutation test, the other cost of a comparison row.

Run: `uv run python benchmarks/compare_stats.py [--runs N]`; the printed table goes into benchmarks/compare.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ckpteval.results import stats


def index_bootstrap(d: np.ndarray, resamples: int = 10_000, seed: int = 0, chunk: int = 500) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    n = len(d)
    means = np.empty(resamples)
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        means[start : start + size] = d[rng.integers(0, n, size=(size, n))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


def cpu(fn, *args) -> float:  # type: ignore[no-untyped-def]
    t = time.process_time()
    fn(*args)
    return time.process_time() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    print(f"load average before: {os.getloadavg()}")
    print("| n (0/1 scores) | index bootstrap (s CPU) | counts bootstrap (s CPU) | ratio | permutation p (s CPU) |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(1)
    for n in (57, 1_000, 14_042):
        d = rng.choice([-1.0, 0.0, 0.0, 0.0, 1.0], size=n)
        index, counts, perm = [], [], []
        for _ in range(runs):
            index.append(cpu(index_bootstrap, d))
            counts.append(cpu(stats.bootstrap_ci, d))
            perm.append(cpu(stats.permutation_p, d))
        a, b = statistics.median(index), statistics.median(counts)
        print(f"| {n} | {a:.3f} | {b:.3f} | {a / b:.1f}x | {statistics.median(perm):.3f} |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
