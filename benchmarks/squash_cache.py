"""Benchmark: the squash step of a second invocation (cache hits) against the first (imports).

Against the test cluster (tests/infra/setup.sh): each round uses a fresh remote_job_dir and a
config with three distinct images (deployment, one task image used twice, the proxy). Invocation 1
imports them (enroot stand-in, through srun); invocation 2, on a new SSH connection like a new CLI
run, must import nothing. Both are timed side by side in the same round; the stand-in's call log
proves the import count, and the DEBUG log of the Remote seam counts the commands sent.
A third measurement is the baseline a per-image check would cost (one `test -s` round trip per
image, as Nemotron's auto-squash does) against our single round trip for all images.

Run: uv run python benchmarks/squash_cache.py [--rounds 5]   (prints a markdown table)
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import time
import uuid
from pathlib import Path

from ckpteval.cluster.connect import connect_remote
from ckpteval.cluster.images import ImageRef
from ckpteval.cluster.squash import ensure_squashed, plan_squash
from ckpteval.config.profiles import make_profile

INFRA = Path("/tmp/ci-infra/infra.json")


class _CommandCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "$ " in record.getMessage():
            self.count += 1


def _imports(log_path: str, tag: str) -> int:
    lines = Path(log_path).read_text().splitlines()
    return sum(1 for line in lines if "\timport " in line and tag in line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    info = json.loads(INFRA.read_text())
    logger = logging.getLogger("ckpteval.remote")
    logger.setLevel(logging.DEBUG)
    counter = _CommandCounter()
    logger.addHandler(counter)

    rows = []
    for _ in range(args.rounds):
        tag = uuid.uuid4().hex[:10]
        rjd = f"{info['user_home']}/ckpteval-bench/{tag}"
        profile = make_profile(
            name="bench",
            host=info["ssh_host"],
            port=info["ssh_port"],
            user=info["ssh_user"],
            identity=info["ssh_key"],
            account=info["slurm_account"],
            partition=info["slurm_partition"],
            time="00:10:00",
            remote_job_dir=rjd,
        )
        # a job's images as `job_images(plan)` lists them: the deployment's and two tasks' (one image)
        images = [
            ImageRef("deployment.image", f"nvcr.io/bench/nemo:{tag}"),
            ImageRef("evaluation.tasks[0].container", f"nvcr.io/bench/lm-eval:{tag}"),
            ImageRef("evaluation.tasks[1].container", f"nvcr.io/bench/lm-eval:{tag}"),
        ]
        measured = {}
        for run in ("first", "second"):
            before_imports, before_cmds = _imports(info["enroot_log"], tag), counter.count
            t0 = time.perf_counter()
            with connect_remote(profile) as remote:
                t1 = time.perf_counter()
                ensure_squashed(images, profile, remote=remote)
                t2 = time.perf_counter()
            measured[run] = {
                "connect": t1 - t0,
                "squash": t2 - t1,
                "imports": _imports(info["enroot_log"], tag) - before_imports,
                "commands": counter.count - before_cmds,
            }
        # baseline for the check itself: one round trip per image vs. one for all
        paths = [i.path for i in plan_squash(images, profile, check=False).items]
        with connect_remote(profile) as remote:
            t0 = time.perf_counter()
            for path in paths:
                remote.run(["test", "-s", path], check=False)
            per_image = time.perf_counter() - t0
            t0 = time.perf_counter()
            plan_squash(images, profile, check=True, remote=remote)
            batched = time.perf_counter() - t0
        rows.append((measured, per_image, batched, len(paths)))
        shutil.rmtree(rjd, ignore_errors=True)

    def med(values: list[float]) -> float:
        return statistics.median(values)

    first = med([m["first"]["squash"] for m, *_ in rows])
    second = med([m["second"]["squash"] for m, *_ in rows])
    per_image = med([p for _, p, _, _ in rows])
    batched = med([b for _, _, b, _ in rows])
    n_images = rows[0][3]
    print(f"rounds: {args.rounds}; distinct images per config: {n_images}; medians over rounds\n")
    print("| measurement | invocation 1 (cold) | invocation 2 (warm) | ratio 2/1 |")
    print("|---|---|---|---|")
    print(f"| squash step wall time | {first * 1000:.0f} ms | {second * 1000:.0f} ms | {second / first:.3f} |")
    print(
        f"| SSH connect | {med([m['first']['connect'] for m, *_ in rows]) * 1000:.0f} ms | "
        f"{med([m['second']['connect'] for m, *_ in rows]) * 1000:.0f} ms | |"
    )
    print(
        f"| enroot imports (call log), every round | {sorted({m['first']['imports'] for m, *_ in rows})} | "
        f"{sorted({m['second']['imports'] for m, *_ in rows})} | |"
    )
    print(
        f"| remote commands sent, every round | {sorted({m['first']['commands'] for m, *_ in rows})} | "
        f"{sorted({m['second']['commands'] for m, *_ in rows})} | |"
    )
    print()
    print("| cache check of all images | time | ratio |")
    print("|---|---|---|")
    print(f"| baseline: one `test -s` round trip per image ({n_images}) | {per_image * 1000:.1f} ms | 1.00 |")
    print(f"| ours: one round trip for all | {batched * 1000:.1f} ms | {batched / per_image:.2f} |")


if __name__ == "__main__":
    main()
