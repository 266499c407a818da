"""Benchmark: pushing the same datasets a second time (all staged already) against the first push.

The datasets are the `pretrain` config's that this environment can fetch (MMLU's 57 subject configs,
ARC-Challenge, PIQA), fetched once from the local hub stand-in (tests/support/hf_hub.py, small copies
in the real layout) into a dataset cache. Each round pushes them into a fresh `${remote_job_dir}/datasets`
on the test cluster (tests/infra/setup.sh) over SSH, twice, each time on a new connection as a new CLI
invocation would. Measured side by side in the same round: wall time, bytes sent (the tar stream the
seam was handed, and independently the bytes paramiko's transport sent), remote commands (round trips,
counted from the Remote seam's DEBUG log). A baseline for the check: one round trip per dataset's
manifest (as a naive per-item `test -s` loop would do) against our one round trip for all.

Run: uv run python benchmarks/data_push.py [--rounds 5]   (prints a markdown table)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.hf_hub import HubStandIn  # noqa: E402
from tests.support.hub_datasets import ALIASES, write_repos  # noqa: E402

from ckpteval.cluster.connect import connect_remote  # noqa: E402
from ckpteval.cluster.data_push import push_datasets, staged_status  # noqa: E402
from ckpteval.config.profiles import make_profile  # noqa: E402
from ckpteval.tasks.data_cache import fetch_datasets, manifest_rel  # noqa: E402
from ckpteval.config.data_select import datasets_of  # noqa: E402

INFRA = Path("/tmp/ci-infra/infra.json")
FETCHABLE = ("adlr_mmlu", "adlr_arc_challenge_llama_25_shot", "piqa")


class _CommandCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "$ " in record.getMessage():
            self.count += 1


def _transport_sent(remote: object) -> int:
    """Bytes paramiko has sent on this connection (packetizer counter), 0 if not an SSH connection."""
    client = getattr(remote, "_client", None)
    transport = client.get_transport() if client is not None else None
    packetizer = getattr(transport, "packetizer", None)
    return int(getattr(packetizer, "_Packetizer__sent_bytes", 0)) if packetizer is not None else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    info = json.loads(INFRA.read_text())
    logger = logging.getLogger("ckpteval.remote")
    logger.setLevel(logging.DEBUG)
    counter = _CommandCounter()
    logger.addHandler(counter)

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="ckpteval-data-bench-"))
    hub = HubStandIn(write_repos(work / "hub"), aliases=ALIASES)
    os.environ["HF_ENDPOINT"] = hub.url
    refs, _ = datasets_of([], list(FETCHABLE))
    t0 = time.perf_counter()
    fetch_datasets(refs, work / "cache")
    fetch_s = time.perf_counter() - t0
    hub.stop()
    cache = work / "cache"
    files = [p for p in cache.rglob("*") if p.is_file() and not p.is_symlink() and not p.name.endswith(".lock")]
    size = sum(p.stat().st_size for p in files)
    links = sum(1 for p in cache.rglob("*") if p.is_symlink())

    rows = []
    for _ in range(args.rounds):
        rjd = f"{info['user_home']}/ckpteval-bench/{uuid.uuid4().hex[:10]}"
        profile = make_profile(
            name="bench",
            host=info["ssh_host"],
            port=info["ssh_port"],
            user=info["ssh_user"],
            identity=info["ssh_key"],
            remote_job_dir=rjd,
        )
        target = f"{rjd}/datasets"
        measured = {}
        for run in ("first", "second"):
            with connect_remote(profile) as remote:
                before_cmds, before_bytes = counter.count, _transport_sent(remote)
                t1 = time.perf_counter()
                result = push_datasets(remote, target, refs, cache)
                t2 = time.perf_counter()
                measured[run] = {
                    "push": t2 - t1,
                    "stream": result.bytes_sent,
                    "wire": _transport_sent(remote) - before_bytes,
                    "commands": counter.count - before_cmds,
                    "staged": len(result.staged),
                }
        with connect_remote(profile) as remote:
            t0 = time.perf_counter()
            for ref in refs:
                remote.run(["test", "-s", f"{target}/{manifest_rel(ref)}"], check=False)
            per_item = time.perf_counter() - t0
            t0 = time.perf_counter()
            staged_status(remote, target, refs, cache)
            batched = time.perf_counter() - t0
        rows.append((measured, per_item, batched))
        shutil.rmtree(rjd, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)

    def med(values: list[float]) -> float:
        return statistics.median(values)

    def col(run: str, key: str) -> float:
        return med([m[run][key] for m, *_ in rows])

    print(f"load average (1, 5, 15 min) before: {load_before}, after: {os.getloadavg()}")
    print(
        f"rounds: {args.rounds}; datasets: {len(refs)}; cache: {size} bytes in {len(files)} files + {links} links; "
        f"fetched in {fetch_s:.1f} s; medians\n"
    )
    print("| measurement | push 1 (nothing staged) | push 2 (all staged) | ratio 2/1 |")
    print("|---|---|---|---|")
    p1, p2 = col("first", "push"), col("second", "push")
    print(f"| wall time | {p1 * 1000:.0f} ms | {p2 * 1000:.0f} ms | {p2 / p1:.3f} |")
    print(f"| tar stream sent | {col('first', 'stream'):.0f} B | {col('second', 'stream'):.0f} B | |")
    w1, w2 = col("first", "wire"), col("second", "wire")
    print(f"| bytes on the SSH transport | {w1:.0f} B | {w2:.0f} B | {w2 / w1:.3f} |")
    print(
        f"| remote commands (round trips), every round | {sorted({m['first']['commands'] for m, *_ in rows})} | "
        f"{sorted({m['second']['commands'] for m, *_ in rows})} | |"
    )
    print(
        f"| datasets staged, every round | {sorted({m['first']['staged'] for m, *_ in rows})} | "
        f"{sorted({m['second']['staged'] for m, *_ in rows})} | |"
    )
    print()
    print("| staged check of all datasets | time | ratio |")
    print("|---|---|---|")
    per_item, batched = med([p for _, p, _ in rows]), med([b for _, _, b in rows])
    print(f"| baseline: one `test -s` round trip per dataset ({len(refs)}) | {per_item * 1000:.1f} ms | 1.00 |")
    print(f"| ours: one round trip for all | {batched * 1000:.1f} ms | {batched / per_item:.2f} |")


if __name__ == "__main__":
    main()
