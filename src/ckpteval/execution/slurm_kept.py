"""On Slurm, one job kept across a watch run's checkpoints: its builtin server loads each new one in place.

The local kept deployment (`watch.kept`) is a process of the watcher's machine. On a cluster the watcher does
not run where the evaluations run, and every evaluation is its own job today: a queue wait, a container and a
model load each time. Here the watcher submits one long-lived **kept job** per run (`ckpteval-kept-<run>`,
one node, the evaluation's own partition, account, GPUs and walltime) whose batch script is the builtin
server itself, started with a *load directory* on the cluster's shared filesystem
(`<remote_job_dir>/watch-kept/<run>/<link>/`, mode 0700: the port, the load secret written by the server, the
job's id in `slurm_job`, its log). Each checkpoint is then the usual invocation with
`deployment.load_into=<that directory>`: its job script, instead of being its own `sbatch`, is started as a
step of the kept job (`srun --jobid=<kept> --overlap`, `execution.slurm.start_in_kept_job`), so its deployment
step reaches the kept server on 127.0.0.1 of the same node, has it load the checkpoint under the invocation's
identity (`server.inplace_client.stand_in`), checks health and identity and runs the tasks as always. Each
checkpoint stays its own invocation (record, job directory, results.json, `status`/`logs`/`cancel` through its
step); its GPU-hours are its step's own elapsed time × the allocation's GPUs (sacct's step record), and what is
left of the kept job (the server's start, the time between checkpoints) is the run's, said when the job ends.

Why steps and not a queue the kept job reads: a step is Slurm's own unit of work inside an allocation, so
sacct accounts each invocation's time, `scancel JOB.STEP` stops one invocation without the server, srun's
messages land in the invocation's directory, and a step asked of a job that has ended fails at once instead
of waiting in an inbox nobody reads.

Before each checkpoint the watcher asks, in a short step of the kept job (`probe`), whether the server serves
and would take the checkpoint (same architecture, tokenizer and saved layout). A checkpoint it refuses gets a
fresh Slurm job of its own (the kept job is stopped; the next fitting checkpoint starts a new one). A kept job
that is no longer running (it died, was cancelled, reached its walltime) is replaced by a new one for the next
checkpoint; an evaluation that was running in it ends with it and is retried as any failed evaluation. The job
takes a new checkpoint only while its time left is at least `MIN_LEFT_S` and 1.5 × the longest evaluation it
has run; otherwise it is stopped and the next link of the chain (a new kept job) takes the checkpoint. Stopping
the watcher (or `watch stop --cancel`) cancels the kept job once no evaluation runs in it.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import json
import os
import posixpath
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.errors import CkptevalError, ClusterError, DeploymentError
from ckpteval.execution.backend import Placement

if TYPE_CHECKING:
    from ckpteval.cluster.remote import Remote
    from ckpteval.config.profiles import Profile

KEPT_DIR = "watch-kept"  # under the profile's remote_job_dir
JOB_FILE = "slurm_job"  # the kept job's Slurm id, in its load directory
SCRIPT_FILE = "kept.sbatch"
MIN_LEFT_S = 120.0  # a kept job with less time left takes no new checkpoint
START_TIMEOUT_S = 1800.0  # the server's start, once the job runs
PROBE = "probe"


def why_no_kept_job() -> str:
    """Why this watcher cannot keep a job ("" when it can): one that runs inside a Slurm job itself (the
    cluster-hosted watcher, `--detach`) would end the steps it starts (their srun) with each link of its chain."""
    if os.environ.get("SLURM_JOB_ID"):
        return "the watcher runs in a Slurm job of its own (--detach): one Slurm job per checkpoint"
    return ""


def kept_job_name(run: str) -> str:
    """The Slurm job name of a run's kept jobs (every link of the chain has it)."""
    return f"ckpteval-kept-{run}"


def kept_root(profile: Profile, run: str) -> str:
    """Where a run's kept jobs keep their load directories on the cluster."""
    from ckpteval.config.executors import slurm_part

    remote_job_dir = slurm_part(profile).remote_job_dir
    if not remote_job_dir:
        raise ClusterError(f"Profile [{profile.name}] has no remote_job_dir: the kept job's files go there.")
    return posixpath.join(remote_job_dir, KEPT_DIR, run)


def render_kept_script(directory: str, spec: Any, server_argv: list[str], env: dict[str, str], run: str) -> str:
    """The kept job's sbatch script: the evaluation's Slurm request on one node, the builtin server as its
    batch shell (exec: scancel's SIGTERM reaches it) with its load directory `directory`."""
    from ckpteval.cluster.sbatch import extra_sbatch_flags, sbatch_flag

    flags: dict[str, Any] = {
        "job_name": kept_job_name(run),
        "nodes": 1,
        "ntasks": 1,
        "time": spec.time,
        "output": posixpath.join(directory, "kept-%j.out"),
        "open_mode": "append",
    }
    if spec.account:
        flags["account"] = spec.account
    if spec.partition:
        flags["partition"] = spec.partition
    if spec.gres:
        flags["gres"] = spec.gres
    flags.update(extra_sbatch_flags(spec.extra_flags))
    lines = ["#!/bin/bash", *(sbatch_flag(k, v) for k, v in flags.items()), ""]
    lines += ["umask 077", f"cd {shlex.quote(directory)}"]
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in env.items()]
    lines += ["export PYTHONUNBUFFERED=1", "exec " + shlex.join(server_argv)]
    return "\n".join(lines) + "\n"


@dataclass
class _Link:
    """One kept job of the chain."""

    job_id: str
    directory: str
    started: float  # when the watcher submitted it
    placed: float | None = None  # when it last took a checkpoint
    longest: float = 0.0  # the longest gap between two checkpoints it took (an evaluation and a poll)


class KeptSlurmJob:
    """The run's kept Slurm job (see the module docstring): submitted on first use, replaced when it dies or
    nears its walltime, cancelled by `stop()`. `compile_first(iteration, iter_dir)`: the evaluation's compiled
    config (its deployment and Slurm request)."""

    def __init__(
        self,
        run: str,
        profile: Profile,
        compile_first: Callable[[int, str], Any] | None,
        *,
        on_note: Callable[[str, int | None], None] = lambda _m, _i: None,
    ) -> None:
        self.run, self.profile, self.compile_first, self.on_note = run, profile, compile_first, on_note
        self.link: _Link | None = None
        self._session: Any = None

    @property
    def session(self) -> Any:
        if self._session is None:
            from ckpteval.cluster.session import ClusterSession

            self._session = ClusterSession(self.profile)
        return self._session

    def call(self, action: Callable[[Remote], Any]) -> Any:
        return self.session.call(action)

    @property
    def first_directory(self) -> str:
        """The load directory of the kept job a watcher would submit now (what the dry run shows)."""
        return posixpath.join(kept_root(self.profile, self.run), "link-at-submission")

    def place(self, iteration: int, iter_dir: str) -> Placement:
        """Where to evaluate `iter_dir`: in the kept job when it fits (a new kept job submitted when none
        runs, or the one running is too near its end), else a fresh Slurm job of its own."""
        notes: list[str] = []
        now = time.time()
        if self.link is not None:
            alive, left = self._time_left(self.link.job_id)
            if self.link.placed is not None:
                self.link.longest = max(self.link.longest, now - self.link.placed)
            need = max(MIN_LEFT_S, 1.5 * self.link.longest)
            if not alive:
                notes.append(f"kept Slurm job {self.link.job_id} no longer runs: a new kept job")
                self._retire()
            elif left is not None and left < need:
                notes.append(
                    f"kept Slurm job {self.link.job_id} has {left:.0f} s left (< {need:.0f} s): it takes no more "
                    "checkpoints, the next link of the chain does"
                )
                self._retire()
        try:
            if self.link is None:
                notes.append(self._start(iteration, iter_dir))
            answer = self._probe(iter_dir)
        except (DeploymentError, ClusterError) as exc:
            self._retire()
            return Placement(
                None, f"iteration {iteration}: the kept Slurm job failed ({exc.message}); a fresh Slurm job for it"
            )
        if not answer.get("answered"):
            self._retire()
            why = answer.get("message") or "no answer"
            return Placement(
                None, f"iteration {iteration}: the kept Slurm job did not answer ({why}); a fresh Slurm job for it"
            )
        if answer.get("refused"):
            self._retire()
            return Placement(
                None,
                f"iteration {iteration}: {'; '.join(answer['refused'])} than the kept deployment: "
                "a fresh Slurm job for it",
            )
        assert self.link is not None
        self.link.placed = time.time()
        return Placement(self.link.directory, "; ".join(f"iteration {iteration}: {n}" for n in notes))

    def _time_left(self, job_id: str) -> tuple[bool, float | None]:
        """Whether the job runs, and its seconds left (None: no limit)."""
        from ckpteval.cluster.slurm import elapsed_seconds

        out = self.call(lambda r: r.run(["squeue", "-h", "-j", job_id, "-o", "%T|%L"], timeout=60, check=False)).stdout
        word, _, left = out.strip().partition("|")
        if word.strip() != "RUNNING":
            return False, None
        return True, elapsed_seconds(left)

    def _start(self, iteration: int, iter_dir: str) -> str:
        """Submit a new kept job for `iter_dir`'s evaluation and wait until it runs (its server's start is the
        probe's to wait for). DeploymentError when Slurm ends it first."""
        from ckpteval.cluster.slurm import job_state, submit_script
        from ckpteval.cluster.submission import sbatch_spec

        assert self.compile_first is not None
        compiled = self.compile_first(iteration, iter_dir)
        directory = posixpath.join(kept_root(self.profile, self.run), f"link-{int(time.time() * 1000)}")
        spec = sbatch_spec(compiled, f"kept-{self.run}", directory)
        config = compiled.config
        env = {**dict(config.execution.env_vars), **dict(getattr(config.deployment, "env_vars", {}) or {})}
        script = render_kept_script(directory, spec, self._server_argv(config.deployment, directory), env, self.run)
        path = posixpath.join(directory, SCRIPT_FILE)

        def submit(remote: Remote) -> str:
            remote.run(["sh", "-c", f"mkdir -p {shlex.quote(directory)} && chmod 700 {shlex.quote(directory)}"])
            remote.write_text_atomic(path, script)
            job_id = submit_script(remote, path, what="watch's kept job")
            remote.write_text_atomic(posixpath.join(directory, JOB_FILE), job_id + "\n")
            return job_id

        started = time.time()
        job_id = self.call(submit)
        self.link = _Link(job_id, directory, started)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            state = self.call(lambda r: job_state(r, job_id))
            if state.state == "RUNNING":
                break
            if (not state.active and state.state != "UNKNOWN") or time.monotonic() > deadline:
                raise DeploymentError(f"the kept Slurm job {job_id} did not start ({state.state.lower()})")
            time.sleep(2.0)
        return f"submitted kept Slurm job {job_id} (running after {time.time() - started:.0f} s; {directory})"

    def _server_argv(self, deployment: Any, directory: str) -> list[str]:
        """The evaluation's own builtin command line, made the kept server's (as `watch.kept` does here): the
        cluster's Python, its port and load secret in the load directory, no invocation's identity."""
        from ckpteval.config.executors import slurm_part
        from ckpteval.deploy.commands import builtin_command
        from ckpteval.server.inplace_client import load_dir_options
        from ckpteval.server.options import ServeOptions

        python = slurm_part(self.profile).python
        load_dir = load_dir_options(Path(directory))
        argv = shlex.split(builtin_command(deployment, python=python, port=0).removeprefix("exec "))
        options = ServeOptions.from_argv(argv[argv.index("serve") + 1 :])
        options = dataclasses.replace(
            options,
            port=0,
            identity=f"{self.run}-kept",
            publish_tokenizer=None,
            load_into=None,
            report_file=Path(directory) / "served_checkpoint.json",
            port_file=load_dir["port_file"],
            load_secret_file=load_dir["load_secret_file"],
        )
        return options.to_argv(python)

    def _probe(self, iter_dir: str) -> dict[str, Any]:
        """Ask the kept server, from a short step of its job, whether it serves and would load `iter_dir`."""
        from ckpteval.config.executors import slurm_part

        assert self.link is not None
        link = self.link
        argv = [
            "srun",
            f"--jobid={link.job_id}",
            "--overlap",
            "--nodes=1",
            "--ntasks=1",
            f"--job-name={kept_job_name(self.run)}-probe",
            slurm_part(self.profile).python,
            "-m",
            "ckpteval.execution.slurm_kept",
            PROBE,
            link.directory,
            iter_dir,
            str(int(START_TIMEOUT_S)),
        ]
        result = self.call(lambda r: r.run(argv, timeout=START_TIMEOUT_S + 120, check=False))
        for line in reversed(result.stdout.splitlines()):
            if line.startswith("{"):
                try:
                    return dict(json.loads(line))
                except ValueError:
                    break
        return {
            "answered": False,
            "message": (result.stderr or result.stdout).strip()[-300:] or f"exit {result.returncode}",
        }

    def _retire(self) -> None:
        """Cancel the current kept job (nothing runs in it: the watcher hands it one checkpoint at a time) and
        say what it used."""
        link, self.link = self.link, None
        if link is None:
            return
        from ckpteval.cluster.slurm import cancel_job

        try:
            self.call(lambda r: cancel_job(r, link.job_id))
            self.on_note(self._usage_line(link.job_id), None)
        except CkptevalError as exc:
            self.on_note(f"cancelling kept Slurm job {link.job_id} failed: {exc.message}", None)

    def _usage_line(self, job_id: str) -> str:
        """The kept job's GPU-hours in all, and how much of it its invocations' steps account for (each
        invocation's own usage); the rest is the server's start and the time between checkpoints."""
        from ckpteval.cluster.slurm import job_allocation

        whole = self.call(lambda r: job_allocation(r, job_id))
        steps = kept_steps(
            self.call(
                lambda r: (
                    r.run(
                        ["sacct", "-n", "-P", "-j", job_id, "-o", "JobID,JobName,Elapsed"], timeout=60, check=False
                    ).stdout
                )
            )
        )
        if not whole:
            return f"kept Slurm job {job_id} stopped"
        gpus = int(whole.get("gpus") or 0)
        total, used = float(whole["elapsed_seconds"]), sum(steps.values())
        return (
            f"kept Slurm job {job_id} stopped: {total:.0f} s × {gpus} GPU(s) = {total * gpus / 3600:.3g} GPU-h; "
            f"its {len(steps)} evaluation step(s) {used:.0f} s (their invocations' own usage), start-up and idle "
            f"{max(0.0, total - used):.0f} s"
        )

    def stop(self) -> None:
        """Cancel the kept job (the watcher ends)."""
        self._retire()
        self.close()

    def stop_leftover(self) -> None:
        """Cancel every kept job of the run (one an earlier watcher left, stopped while an evaluation ran in it)."""
        from ckpteval.cluster.slurm import cancel_named

        try:
            self.call(lambda r: cancel_named(r, kept_job_name(self.run)))
        finally:
            self.close()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


def kept_steps(sacct: str) -> dict[str, float]:
    """`sacct -n -P -o JobID,JobName,Elapsed` of a kept job: its invocations' steps (named `ckpteval-<id>`)
    and their elapsed seconds."""
    from ckpteval.cluster.sbatch import JOB_NAME_PREFIX
    from ckpteval.cluster.slurm import elapsed_seconds

    steps = {}
    for line in sacct.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 3 or "." not in fields[0] or not fields[1].startswith(JOB_NAME_PREFIX):
            continue
        if not fields[1].startswith("ckpteval-kept-"):  # its own probes are the kept job's, not an invocation's
            steps[fields[0]] = elapsed_seconds(fields[2]) or 0.0
    return steps


def probe(directory: str, checkpoint: str, timeout: float) -> dict[str, Any]:
    """In the kept job: wait until its server serves (its port written, healthy), then ask whether it would load
    `checkpoint` (`load_in_place(check=True)`)."""
    from ckpteval.server.inplace_client import PORT_FILE, load_in_place, server_url
    from ckpteval.server.launch import wait_until_healthy

    load_dir = Path(directory)
    deadline = time.monotonic() + timeout
    while not (load_dir / PORT_FILE).is_file():
        if time.monotonic() > deadline:
            return {"answered": False, "message": f"the kept server wrote no port in {timeout:.0f} s"}
        time.sleep(0.2)
    try:
        wait_until_healthy(server_url(load_dir), timeout=max(1.0, deadline - time.monotonic()))
        answer = load_in_place(load_dir, checkpoint, check=True, timeout=600)
    except DeploymentError as exc:
        return {"answered": False, "message": exc.message}
    refused = list(answer.refused) if answer.status == 409 else []
    return {"answered": True, "status": answer.status, "refused": refused, "message": answer.message}


def main(argv: list[str]) -> int:
    """`python -m ckpteval.execution.slurm_kept probe DIR CHECKPOINT TIMEOUT`: one JSON line."""
    if len(argv) != 4 or argv[0] != PROBE:
        print("usage: python -m ckpteval.execution.slurm_kept probe DIR CHECKPOINT TIMEOUT", file=sys.stderr)
        return 2
    print(json.dumps(probe(argv[1], argv[2], float(argv[3]))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
