"""The Slurm job of the cluster-hosted watcher (`evaluate watch ... --detach`, `ckpteval.watch.hosted`): its
`#SBATCH` header, from the Slurm profile's `watch_*` keys.

A CPU-only job (one CPU, no GPU), its time limit and `B:USR1` `watch_signal_lead` seconds ahead of it (the
watcher resubmits itself then), one link of a run at a time (`--dependency=singleton` on the job name),
requeued if its node fails. The watcher's own lines follow the header (`watch.hosted` writes them).
"""

from __future__ import annotations

import shlex

from ckpteval.config.executors import SlurmProfile


def watcher_header(part: SlurmProfile, *, name: str, output: str) -> list[str]:
    """The script's first lines: the shebang and the `#SBATCH` request (watch_partition/account/time, else the
    evaluations' partition/account)."""
    flags = {
        "job-name": name,
        "partition": part.watch_partition or part.partition,
        "account": part.watch_account or part.account,
        "time": part.watch_time,
        "nodes": "1",
        "ntasks": "1",
        "cpus-per-task": "1",
        "signal": f"B:USR1@{part.watch_signal_lead}",
        "dependency": "singleton",
        "output": output,
    }
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH --{k}={shlex.quote(str(v))}" for k, v in flags.items() if v]
    lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append", ""]
    return lines


def watcher_python(part: SlurmProfile) -> tuple[str, str]:
    """The profile key naming the Python that runs the watcher on the cluster, and that Python."""
    return ("watch_python", part.watch_python) if part.watch_python else ("python", part.python)
