"""`evaluate watch`: how soon a completed checkpoint is submitted, and what the watcher costs per poll.

    uv run python benchmarks/watch_latency.py [--every 2] [--checkpoints 8] [--ssh]

1. Latency, complete -> submitted. A real `Watcher` polls a real save dir every `--every` seconds (the
   listing command run here) in a thread; this script completes checkpoints one by one at random moments
   (writing `metadata.json`, the file Megatron's writer finishes with) and the pipeline's `submit` records
   when it is called, after compiling the evaluation's config for real (`compile_evaluation`, which is
   what the real submit does before it starts the job). Expected: about every/2 waiting for the next poll,
   plus the poll and the compile.
2. Cost per poll: wall and CPU time (this process plus the listing's child shell) of one listing of a save
   dir with N = 10, 100, 1000 iteration dirs, here and (with --ssh, on the test cluster of tests/infra)
   over SSH, counting SSH round trips. Baseline, side by side: listing each iteration dir with its own
   command (one round trip per checkpoint), what a watcher that checks checkpoints one by one pays.

Prints a markdown record with the load average; results go in watch.md next to this file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ckpteval.cluster.remote import LocalRemote, Remote  # noqa: E402
from ckpteval.watch.loop import Watcher  # noqa: E402
from ckpteval.watch.readiness import MARKERS, list_save_dir, listing_command  # noqa: E402
from ckpteval.watch.state import WatchSpec, WatchState  # noqa: E402
from ckpteval.watch.submit import EvaluationState, compile_evaluation  # noqa: E402


def _save(root: Path, iteration: int, *, complete: bool) -> Path:
    path = root / f"iter_{iteration:07d}"
    path.mkdir(parents=True, exist_ok=True)
    for name in ["common.pt", "__0_0.distcp", ".metadata"] + (["metadata.json"] if complete else []):
        (path / name).write_bytes(b"x")
    return path


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def latency(every: float, count: int, work: Path) -> tuple[list[float], list[float]]:
    root = work / "latency" / "checkpoints"
    (root / "tokenizer").mkdir(parents=True)
    spec = WatchSpec(
        save_dir=str(root),
        configs=["tiny"],
        profile=None,
        tasks=["hellaswag"],
        overrides=[],
        every=every,
        max_pending=count,
    )
    completed: dict[int, float] = {}
    submitted: dict[int, float] = {}
    compiles: list[float] = []

    class Pipeline:
        def submit(self, iteration: int, iter_dir: str) -> str:
            started = time.monotonic()
            compile_evaluation(spec, iteration, iter_dir, run="bench")
            submitted[iteration] = time.monotonic()
            compiles.append(submitted[iteration] - started)
            return f"bench-{iteration}"

        def state(self, invocation: str) -> EvaluationState:
            return EvaluationState(invocation, "running")

    state = WatchState(run="bench-000000", spec=spec, created=time.time())
    watcher = Watcher(state, lister=lambda: list_save_dir(LocalRemote(), str(root)), pipeline=Pipeline())
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, kwargs={"should_stop": stop.is_set}, daemon=True)
    thread.start()
    rng = random.Random(7)
    for n in range(1, count + 1):
        iteration = n * 100
        iter_dir = _save(root, iteration, complete=False)
        time.sleep(rng.uniform(0.2, every * 1.5))
        (iter_dir / "metadata.json").write_bytes(b"{}")
        completed[iteration] = time.monotonic()
        deadline = time.monotonic() + every * 3 + 60
        while iteration not in submitted and time.monotonic() < deadline:
            time.sleep(0.02)
    stop.set()
    thread.join(timeout=every + 5)
    return [submitted[i] - completed[i] for i in sorted(completed) if i in submitted], compiles


class CountingRemote:
    """A Remote that counts the commands (round trips) it runs."""

    def __init__(self, remote: Remote) -> None:
        self.remote, self.calls = remote, 0

    @property
    def description(self) -> str:
        return self.remote.description

    def run(self, argv, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        return self.remote.run(argv, **kwargs)


def per_checkpoint_baseline(remote: CountingRemote, root: str) -> int:
    """List the dir, then test each iteration dir with its own command (one round trip per checkpoint)."""
    names = remote.run(f"ls -1 {root}", check=False).stdout.split()
    ready = 0
    for name in names:
        if name.startswith("iter_"):
            tests = " && ".join(f"[ -f {root}/{name}/{m} ]" for m in MARKERS)
            ready += remote.run(tests, check=False).ok
    return ready


def poll_cost(remote: Remote, root: Path, sizes: list[int], repeats: int) -> list[dict]:
    rows = []
    for n in sizes:
        save = root / f"n{n}"
        for i in range(1, n + 1):
            _save(save, i * 10, complete=True)
        if isinstance(remote, LocalRemote) is False:
            _chown_for_ssh(save)
        for method in ("one listing per poll", "one command per checkpoint (baseline)"):
            counting = CountingRemote(remote)
            walls, cpus = [], []
            for _ in range(repeats):
                cpu0, wall0 = _cpu(), time.perf_counter()
                if method.startswith("one listing"):
                    found = len(list_save_dir(counting, str(save)).ready)  # type: ignore[arg-type]
                else:
                    found = per_checkpoint_baseline(counting, str(save))
                walls.append(time.perf_counter() - wall0)
                cpus.append(_cpu() - cpu0)
                assert found == n, (method, found, n)
            rows.append(
                {
                    "where": remote.description,
                    "checkpoints": n,
                    "method": method,
                    "round_trips": counting.calls // repeats,
                    "wall_s": statistics.median(walls),
                    "cpu_s": statistics.median(cpus),
                }
            )
    return rows


def _chown_for_ssh(path: Path) -> None:
    import pwd

    info = json.loads(Path(os.environ.get("CI_INFRA_DIR", "/tmp/ci-infra"), "infra.json").read_text())
    user = pwd.getpwnam(info["ssh_user"])
    for dirpath, dirnames, filenames in os.walk(path.parent):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(name, user.pw_uid, user.pw_gid)


def _ssh_remote() -> tuple[Remote, Path]:
    from ckpteval.cluster.remote import connect_remote
    from ckpteval.config.profiles import make_profile

    info = json.loads(Path(os.environ.get("CI_INFRA_DIR", "/tmp/ci-infra"), "infra.json").read_text())
    profile = make_profile(
        name="bench",
        host=info["ssh_host"],
        port=info["ssh_port"],
        user=info["ssh_user"],
        identity=info["ssh_key"],
        host_key_policy="accept-new",
    )
    return connect_remote(profile), Path(info["user_home"]) / "ckpteval-bench-watch" / str(os.getpid())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--checkpoints", type=int, default=8)
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ssh", action="store_true", help="also list over SSH on the tests/infra cluster")
    parser.add_argument("--latency-only", action="store_true", help="skip the listing costs")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="watch-bench-") as tmp:
        work = Path(tmp)
        os.environ.setdefault("CKPTEVAL_STATE_DIR", str(work / "state"))
        lat, compiles = latency(args.every, args.checkpoints, work)
        rows = [] if args.latency_only else poll_cost(LocalRemote(), work / "local", sizes, args.repeats)
        if args.ssh and not args.latency_only:
            import shutil

            remote, root = _ssh_remote()
            try:
                rows += poll_cost(remote, root, sizes, args.repeats)
            finally:
                remote.close()
                shutil.rmtree(root.parent, ignore_errors=True)
    print(f"load average after: {os.getloadavg()}\n")
    print(f"## complete -> submitted (every {args.every:g} s, {len(lat)} checkpoints)\n")
    print("| mean | median | min | max | of which compiling the config (mean) | expected poll wait (every/2) |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {statistics.mean(lat):.2f} s | {statistics.median(lat):.2f} s | {min(lat):.2f} s | {max(lat):.2f} s "
        f"| {statistics.mean(compiles):.2f} s | {args.every / 2:.2f} s |\n"
    )
    print("## cost of one poll's listing (median of", args.repeats, "runs)\n")
    print("| where | checkpoints | method | round trips | wall | CPU (watcher + child shells) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['where']} | {r['checkpoints']} | {r['method']} | {r['round_trips']} "
            f"| {r['wall_s'] * 1000:.1f} ms | {r['cpu_s'] * 1000:.1f} ms |"
        )
    print("\nlisting command:", listing_command("/SAVE/DIR"))


if __name__ == "__main__":
    main()
