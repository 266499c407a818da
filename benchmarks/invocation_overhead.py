"""The fixed cost of one invocation: `evaluate -c tiny` from start to its first request, and from its last
response to exit.

    uv run python benchmarks/invocation_overhead.py [--runs 1] [--modes during,after] [--limit N]

Each run starts `uv run evaluate -c tiny` (SmolLM2-135M on the builtin server, adlr_mmlu, 57 requests,
on this machine) in a fresh working directory, once per mode: `during` (the default: the task client
prepares while the model loads) and `after` (`evaluation.prepare_during_load=false`: the client starts once
the deployment is healthy, the behaviour before). It splits each one's wall clock into phases, from:

- this script's clock: process start and exit;
- the job's files: `state/started` and the `[ckpteval HH:MM:SS]` lines of `logs/job.log` (deployment
  starting / healthy, task running / succeeded, all tasks done; 1 s resolution);
- the task's `eval_factory_metrics.json`: first and last request seen at nemo-evaluator's interceptor proxy.

Baseline, side by side in the same run (before and after each invocation): the builtin server started
directly on the same checkpoint, start -> healthy. That is the model's own load time, the part of
"start -> first request" that any way of evaluating the checkpoint pays; the rest is the tool's.
The script prints a markdown record; results go in invocation_overhead.md next to this file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.conftest import (  # noqa: E402
    ServerCommand,
    free_port,
    serve,
)

_SAY = re.compile(r"^\[ckpteval (\d\d:\d\d:\d\d)\] (.*)$", re.M)


@dataclass(frozen=True)
class Timeline:
    """Wall-clock instants (epoch seconds) of one invocation."""

    start: float
    job_started: float
    deploy_start: float
    healthy: float
    task_start: float
    first_request: float
    last_request: float
    task_done: float
    all_done: float
    exit: float
    requests: int

    def phases(self) -> dict[str, float]:
        """Seconds per phase, in order; they add up to the whole run (the line in brackets is not a phase)."""
        return {
            "CLI start -> job started": self.job_started - self.start,
            "job started -> deployment starting": self.deploy_start - self.job_started,
            "deployment starting -> healthy": self.healthy - self.deploy_start,
            "(task client started, from deployment starting)": self.task_start - self.deploy_start,
            "healthy -> first request": self.first_request - self.healthy,
            "first -> last request": self.last_request - self.first_request,
            "last request -> task client done": self.task_done - self.last_request,
            "task done -> deployment stopped, job done": self.all_done - self.task_done,
            "job done -> CLI exit": self.exit - self.all_done,
        }


def _utc_on(day: datetime, hms: str) -> float:
    """Epoch seconds of a job.log HH:MM:SS (UTC) on `day` (a run does not cross midnight here)."""
    t = datetime.strptime(hms, "%H:%M:%S").time()
    return datetime.combine(day.date(), t, tzinfo=UTC).timestamp()


def read_timeline(job_dir: Path, start: float, end: float) -> Timeline:
    """The instants of one finished invocation, from its job directory."""
    started_text = (job_dir / "state" / "started").read_text().strip()
    started = datetime.strptime(started_text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    says = [(_utc_on(started, hms), text) for hms, text in _SAY.findall((job_dir / "logs" / "job.log").read_text())]

    def at(prefix: str) -> float:
        found = [t for t, text in says if text.startswith(prefix)]
        if not found:
            raise RuntimeError(f"no '{prefix}' line in {job_dir}/logs/job.log")
        return found[-1]

    (metrics,) = job_dir.glob("tasks/*/output/eval_factory_metrics.json")
    stats = json.loads(metrics.read_text())["response_stats"]
    runs = list(stats["inference_run_times"].values())
    # nemo-evaluator writes local naive times (datetime.now()); .timestamp() reads them as local time
    first = datetime.fromisoformat(runs[0]["first_request_time"]).timestamp()
    last = datetime.fromisoformat(runs[-1]["last_request_time"]).timestamp()
    return Timeline(
        start=start,
        job_started=started.timestamp(),
        deploy_start=at("starting the deployment"),
        healthy=at("deployment healthy"),
        task_start=at("task adlr_mmlu: running"),
        first_request=first,
        last_request=last,
        task_done=at("adlr_mmlu: succeeded"),
        all_done=at("all tasks succeeded"),
        exit=end,
        requests=int(stats["count"]),
    )


MODES = {"during": [], "after": ["evaluation.prepare_during_load=false"]}


def run_invocation(work: Path, overrides: list[str]) -> tuple[Timeline, str]:
    """`uv run evaluate -c tiny [overrides]` in a fresh directory (own state and config dirs); its timeline."""
    cwd = work / "cwd"
    cwd.mkdir(parents=True)
    env = {**os.environ, "XDG_STATE_HOME": str(work / "state"), "XDG_CONFIG_HOME": str(work / "config")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", COLUMNS="200")
    start = time.time()
    proc = subprocess.run(
        ["uv", "run", "--project", str(REPO), "evaluate", "-c", "tiny", *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    end = time.time()
    if proc.returncode != 0:
        raise RuntimeError(
            f"evaluate -c tiny failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    invocation = re.search(r"invocation\s+([0-9a-f]{8})", proc.stdout)
    if invocation is None:
        raise RuntimeError(f"no invocation id in the output:\n{proc.stdout[-2000:]}")
    return read_timeline(cwd / "results" / invocation.group(1), start, end), invocation.group(1)


def server_startup(work: Path) -> float:
    """Seconds from starting the builtin server directly on tiny's checkpoint to its health check answering."""
    from ckpteval.server.launch import serve_command
    from ckpteval.server.prepare import default_checkpoint_dir, ensure_prepared

    checkpoint = ensure_prepared("smollm2", default_checkpoint_dir("smollm2"))  # where `-c tiny` finds it
    port = free_port()
    argv = serve_command(
        python=sys.executable, checkpoint=str(checkpoint), port=port, served_model_name="smollm2", device="cpu"
    )
    command = ServerCommand(argv=argv, cwd=REPO, model_id="smollm2", tokenizer=None)
    work.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with serve(command, port, work / "server.log"):
        return time.time() - start


def load_average() -> str:
    """The 1-minute load average."""
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> None:
    """Alternate: server start-up (baseline), invocation, server start-up; print a markdown record."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--modes", default="during,after", help="comma-separated: during, after")
    parser.add_argument("--limit", type=int, default=None, help="limit_samples (default: the config's, 57)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"--modes: choose from {', '.join(MODES)} (got {args.modes!r})")
    before, started = load_average(), time.strftime("%H:%M")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckpteval-overhead-") as tmp:
        work = Path(tmp)
        for r in range(args.runs):
            base_before = server_startup(work / f"r{r}" / "server-before")
            timed = []
            for mode in modes:
                limit = (
                    []
                    if args.limit is None
                    else [f"evaluation.nemo_evaluator_config.config.params.limit_samples={args.limit}"]
                )
                timeline, invocation = run_invocation(work / f"r{r}" / mode, [*MODES[mode], *limit])
                timed.append((mode, timeline, invocation))
                print(mode, invocation, json.dumps(timeline.phases()), flush=True)
            base_after = server_startup(work / f"r{r}" / "server-after")
            print("baseline server start-up", base_before, base_after, flush=True)
            for mode, timeline, invocation in timed:
                rows.append((timeline, f"{mode} {invocation}", (base_before + base_after) / 2, load_average()))
    limit_arg = "" if args.limit is None else f" --limit {args.limit}"
    print(render(rows, args.runs, started, before, load_average(), limit_arg))


def render(
    rows: list[tuple[Timeline, str, float, str]], runs: int, started: str, before: str, after: str, limit: str = ""
) -> str:
    """Markdown: phases per run (s), then the two fixed overheads against the baseline server start-up."""
    names = list(rows[0][0].phases())
    lines = [
        f"## Run ({started}, load {before} → {after})",
        "",
        f"Machine: {os.uname().machine}, {os.cpu_count()} cores. Command: "
        f"`uv run python benchmarks/invocation_overhead.py --runs {runs}{limit}` (modes side by side in each run)",
        "",
        "| phase (s) | "
        + " | ".join(f"run {i} ({inv}, load after {load})" for i, (_, inv, _, load) in enumerate(rows, 1))
        + " |",
        "|---|" + "---|" * len(rows),
    ]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{t.phases()[name]:.1f}" for t, *_ in rows) + " |")
    lines.append("| **total** | " + " | ".join(f"**{t.exit - t.start:.1f}**" for t, *_ in rows) + " |")
    lines.append("| requests | " + " | ".join(str(t.requests) for t, *_ in rows) + " |")
    lines += [
        "",
        "| run, mode | start -> first request (s) | baseline: server start -> healthy (s) | start -> first request, "
        "beyond the server's own start-up (s) | last request -> exit (s) | fixed overhead / total |",
        "|---|---|---|---|---|---|",
    ]
    for i, (t, name, base, _) in enumerate(rows, 1):
        to_first, after_last = t.first_request - t.start, t.exit - t.last_request
        lines.append(
            f"| {i} {name} | {to_first:.1f} | {base:.1f} | {to_first - base:.1f} | {after_last:.1f} | "
            f"{(to_first + after_last) / (t.exit - t.start):.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
