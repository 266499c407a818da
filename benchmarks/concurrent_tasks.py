"""Tasks side by side against the one deployment vs one after another: wall clock, and the scores equal.

    uv run python benchmarks/concurrent_tasks.py [--rounds 1] [--limit 1] [--tasks adlr_mmlu hellaswag gsm8k]
        [--set key=value ...]

Each round runs, alternately (so both see the same load), in fresh working directories:

- `evaluate -c tiny -t adlr_mmlu -t hellaswag -t gsm8k limit_samples=L evaluation.max_parallel_tasks=1`
  (the baseline: one task after another, the behaviour before concurrent tasks),
- the same with the default (`max_parallel_tasks` null: all three side by side).

It prints the wall clock of each, their ratio (concurrent / sequential), the load average before each run,
and whether every task's metrics are identical in both. Results go in concurrent_tasks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TASKS = ("adlr_mmlu", "hellaswag", "gsm8k")


def run(work: Path, limit: int, tasks: tuple[str, ...], *overrides: str) -> tuple[float, dict[str, dict[str, float]]]:
    """Wall clock of one `evaluate -c tiny` with `tasks`, and each task's metric values."""
    cwd = work / "cwd"
    cwd.mkdir(parents=True)
    env = {**os.environ, "XDG_STATE_HOME": str(work / "state"), "XDG_CONFIG_HOME": str(work / "config")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", COLUMNS="200")
    argv = ["uv", "run", "--project", str(REPO), "evaluate", "-c", "tiny", *(a for t in tasks for a in ("-t", t))]
    argv += [f"evaluation.nemo_evaluator_config.config.params.limit_samples={limit}", *overrides]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    invocation = re.search(r"invocation\s+([0-9a-f]{8})", proc.stdout)
    assert invocation, proc.stdout[-2000:]
    results = json.loads((cwd / "results" / invocation.group(1) / "results.json").read_text())
    scores = {
        name: {metric: m["value"] for metric, m in task["metrics"].items()} for name, task in results["tasks"].items()
    }
    return wall, scores


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--limit", type=int, default=1)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="key=value for both runs (another model ...)"
    )
    args = parser.parse_args()
    ratios, rows = [], []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="ckpteval-concurrent-") as tmp:
            load_seq = os.getloadavg()
            seq, seq_scores = run(
                Path(tmp) / "sequential",
                args.limit,
                tuple(args.tasks),
                *args.overrides,
                "evaluation.max_parallel_tasks=1",
            )
            load_con = os.getloadavg()
            con, con_scores = run(Path(tmp) / "concurrent", args.limit, tuple(args.tasks), *args.overrides)
        ratios.append(con / seq)
        rows.append((i + 1, seq, load_seq, con, load_con, con / seq, seq_scores == con_scores))
        print(f"round {i + 1}: scores sequential {seq_scores}\n         concurrent {con_scores}", flush=True)
    print("\n| round | sequential (s) | load before | concurrent (s) | load before | ratio | scores identical |")
    print("|---|---|---|---|---|---|---|")
    for r, seq, ls, con, lc, ratio, same in rows:
        load_s, load_c = " ".join(f"{x:.1f}" for x in ls), " ".join(f"{x:.1f}" for x in lc)
        print(f"| {r} | {seq:.0f} | {load_s} | {con:.0f} | {load_c} | {ratio:.2f} | {'yes' if same else 'NO'} |")
    print(f"\nmedian ratio concurrent / sequential: {statistics.median(ratios):.2f}; cores: {os.cpu_count()}")


if __name__ == "__main__":
    main()
