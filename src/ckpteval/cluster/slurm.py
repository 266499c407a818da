"""Slurm through the Remote seam: the one place that speaks sbatch, squeue, sacct and scancel (an
invocation's job itself is submitted through nemo-run: `ckpteval.cluster.nemorun`).

A job's state (squeue, then sacct), cancelling it, checking a profile, and for scripts of ours that are no
invocation (the cluster-hosted watcher's links): submitting one, listing the jobs of a name, cancelling or
signalling them. These are the fast paths (one round trip each, no nemo-run import): `status`, `logs -f` and
the attached follow call them every few seconds. squeue answers for queued and running jobs without the
accounting database; sacct answers once the job has left the queue. Over an SSH Remote from the user's
machine, or a local one on the cluster itself (the watcher submits its next link from its node).
"""

from __future__ import annotations

import posixpath
import shlex
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ckpteval.cluster.remote import Remote
from ckpteval.errors import ClusterError

ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING")


@dataclass(frozen=True)
class SlurmJobState:
    """What Slurm says about a job: its state word, and why it waits or how it ended."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... or UNKNOWN
    reason: str = ""  # squeue's reason while pending (Resources, Priority, JobHeldUser, ...)
    exit_code: str = ""  # sacct's ExitCode ("0:0", "1:0", "0:15")
    elapsed: str = ""
    node: str = ""  # squeue's node list, when listed by name

    @property
    def active(self) -> bool:
        """Queued or running (Slurm still holds the job)."""
        return self.state in ACTIVE

    @property
    def pending(self) -> bool:
        """Waiting for resources (or held, or requeued)."""
        return self.state in ("PENDING", "REQUEUED", "CONFIGURING")


def _clean_state(word: str) -> str:
    # sacct writes "CANCELLED by 1001"; squeue may append "+" for requeued states
    return word.strip().split(" ")[0].rstrip("+").upper()


def job_state(remote: Remote, job_id: str) -> SlurmJobState:
    """The job's state: squeue while Slurm holds it, sacct afterwards (UNKNOWN if neither knows it)."""
    jid = shlex.quote(str(job_id))
    # one round trip: squeue's line if queued/running, else sacct's allocation line
    script = (
        f"out=$(squeue -h -j {jid} -o '%T|%r' 2>/dev/null); "
        f'if [ -n "$out" ]; then echo "Q|$out"; '
        f"else sacct -X -n -P -j {jid} -o State,ExitCode,Elapsed 2>&1 | head -n 1 | sed 's/^/A|/'; fi"
    )
    result = remote.run(["sh", "-c", script], timeout=60, check=False)
    line = result.stdout.strip().splitlines()[0] if result.stdout.strip() else ""
    kind, _, rest = line.partition("|")
    fields = rest.split("|")
    if kind == "Q" and fields and fields[0]:
        reason = fields[1].strip() if len(fields) > 1 else ""
        reason = "" if reason == "None" else reason
        return SlurmJobState(job_id=str(job_id), state=_clean_state(fields[0]), reason=reason)
    if kind == "A" and len(fields) >= 2 and fields[0] and not fields[0].startswith("sacct:"):
        return SlurmJobState(
            job_id=str(job_id),
            state=_clean_state(fields[0]),
            exit_code=fields[1].strip(),
            elapsed=fields[2].strip() if len(fields) > 2 else "",
        )
    return SlurmJobState(job_id=str(job_id), state="UNKNOWN", reason=(rest or result.stderr).strip()[:200])


ALLOCATION_FIELDS = "JobID,Elapsed,AllocTRES,Start,State"


def job_allocation(remote: Remote, job_id: str) -> dict[str, Any] | None:
    """The scheduler's accounting of a job's allocation (`sacct -X`): elapsed seconds, GPUs allocated, its start;
    None when sacct does not know the job (accounting off, or not recorded yet)."""
    result = remote.run(
        ["sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", ALLOCATION_FIELDS], timeout=60, check=False
    )
    for line in result.stdout.splitlines():
        parsed = parse_sacct_allocation(line)
        if parsed is not None and parsed["job"] == str(job_id):
            return parsed
    return None


def parse_sacct_allocation(line: str) -> dict[str, Any] | None:
    """One line of `sacct -X -n -P -o JobID,Elapsed,AllocTRES,Start,State` as `state/allocation.json`'s content:
    elapsed seconds, GPUs allocated (`gres/gpu=N` of AllocTRES), its start (epoch seconds); None for a line
    that is not such a record (a job sacct does not know yet)."""
    fields = line.strip().split("|")
    if len(fields) < 5 or not fields[0] or fields[0].startswith("sacct:"):
        return None
    elapsed = elapsed_seconds(fields[1])
    if elapsed is None:
        return None
    gpus = 0
    for part in fields[2].split(","):
        name, _, value = part.partition("=")
        if name in ("gres/gpu", "gpu") and value.isdigit():
            gpus = int(value)
    start = None
    try:
        start = datetime.fromisoformat(fields[3]).timestamp() if fields[3] not in ("", "Unknown") else None
    except ValueError:
        start = None
    return {
        "job": fields[0],
        "elapsed_seconds": elapsed,
        "gpus": gpus,
        "start": start,
        "state": fields[4].split(" ")[0],
        "alloc_tres": fields[2],
    }


def elapsed_seconds(text: str) -> float | None:
    """Slurm's `[D-]HH:MM:SS` (or `MM:SS`) as seconds; None if it is not one."""
    days, _, clock = text.strip().rpartition("-")
    parts = clock.split(":")
    if not clock or not all(p.isdigit() for p in parts) or not 2 <= len(parts) <= 3 or (days and not days.isdigit()):
        return None
    numbers = [int(p) for p in parts]
    if len(numbers) == 2:
        numbers.insert(0, 0)
    hours, minutes, seconds = numbers
    return float((int(days or 0) * 24 + hours) * 3600 + minutes * 60 + seconds)


def cancel_job(remote: Remote, job_id: str, *, wait: float = 60.0) -> SlurmJobState:
    """`scancel` the job and wait (up to `wait` s) until Slurm no longer runs it; returns its state then."""
    remote.run(["scancel", str(job_id)], timeout=60)
    deadline = time.monotonic() + wait
    state = job_state(remote, job_id)
    # CANCELLED shows in squeue while the steps are killed (COMPLETING); wait until it has left the queue
    while (state.active or state.state == "UNKNOWN") and time.monotonic() < deadline:
        time.sleep(0.5)
        state = job_state(remote, job_id)
    return state


def submit_script(remote: Remote, path: str, *, what: str) -> str:
    """`sbatch --parsable PATH` (a script already there); its job id. ClusterError with sbatch's own words
    (`what` names the job in them: "the watcher's job") when Slurm refuses it."""
    result = remote.run(["sbatch", "--parsable", path], check=False, timeout=120)
    job_id = result.stdout.strip().split(";")[0]
    if not result.ok or not job_id:
        text, hint = explain_sbatch_error(result.stderr or result.stdout, None)
        raise ClusterError(f"Slurm refused {what} (sbatch):\n{text}", hint=hint)
    return job_id


def jobs_named(remote: Remote, name: str) -> list[SlurmJobState]:
    """The jobs named `name` that Slurm holds now (queued, running or ending), oldest first."""
    result = remote.run(["squeue", "-h", "--name", name, "-o", "%i|%T|%N|%r"], check=False, timeout=60)
    jobs = []
    for line in result.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 4 and fields[0]:
            reason = "" if fields[3] == "None" else fields[3]
            jobs.append(SlurmJobState(job_id=fields[0], state=_clean_state(fields[1]), reason=reason, node=fields[2]))
    return sorted(jobs, key=lambda j: int(j.job_id) if j.job_id.isdigit() else 0)


def cancel_jobs(remote: Remote, job_ids: list[str], *, signal: str | None = None) -> None:
    """`scancel` the jobs at once; with `signal`, send it to their batch scripts instead (which end themselves)."""
    if job_ids:
        flags = ["--batch", f"--signal={signal}"] if signal else []
        remote.run(["scancel", *flags, *job_ids], check=False, timeout=60)


def cancel_named(remote: Remote, name: str) -> None:
    """`scancel` every job named `name` (what a listing may have missed too)."""
    remote.run(["scancel", "--name", name], check=False, timeout=60)


@dataclass(frozen=True)
class ClusterFacts:
    """What the cluster offers the user: partitions, and accounts if Slurm enforces them."""

    partitions: tuple[str, ...]
    accounts: tuple[str, ...] | None  # None: associations are not enforced (any account is accepted)
    user: str


_FACTS_SCRIPT = r"""
echo "user|$(id -un)"
sinfo -h -o '%R' 2>/dev/null | sed 's/^/partition|/'
enforce=$(scontrol show config 2>/dev/null | sed -n 's/^AccountingStorageEnforce *= *//p')
echo "enforce|$enforce"
case "$enforce" in
  *associations*)
    sacctmgr -n -P show assoc user="$(id -un)" format=account 2>/dev/null | sort -u | sed 's/^/account|/' ;;
esac
"""


def cluster_facts(remote: Remote) -> ClusterFacts:
    """Partitions (sinfo) and, where Slurm enforces associations, the user's accounts (sacctmgr)."""
    result = remote.run(["sh", "-c", _FACTS_SCRIPT], timeout=60, check=False)
    partitions: list[str] = []
    accounts: list[str] = []
    enforced = False
    user = ""
    for line in result.stdout.splitlines():
        key, _, value = line.partition("|")
        value = value.strip()
        if key == "user":
            user = value
        elif key == "partition" and value:
            partitions.append(value)
        elif key == "enforce":
            enforced = "associations" in value
        elif key == "account" and value:
            accounts.append(value)
    return ClusterFacts(
        partitions=tuple(dict.fromkeys(partitions)), accounts=tuple(accounts) if enforced else None, user=user
    )


def check_request(facts: ClusterFacts, *, partition: str | None, account: str | None, where: str) -> None:
    """Refuse a partition the cluster does not have, or an account the user may not charge, before submitting."""
    if partition and facts.partitions and partition not in facts.partitions:
        raise ClusterError(
            f"Partition '{partition}' does not exist on {where}.",
            hint="Partitions there: " + ", ".join(facts.partitions) + ". Set `partition` in the env.toml profile.",
        )
    if account and facts.accounts is not None and account not in facts.accounts:
        shown = ", ".join(facts.accounts) if facts.accounts else "none"
        raise ClusterError(
            f"Slurm account '{account}' is not one {facts.user or 'you'} may use on {where}.",
            hint=f"Your accounts there: {shown}. Set `account` in the env.toml profile.",
        )


def explain_sbatch_error(stderr: str, facts: ClusterFacts | None) -> tuple[str, str | None]:
    """sbatch's own words, and a hint when we know what they mean."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    text = "\n".join(lines[-5:]) or "sbatch gave no reason"
    low = stderr.lower()
    hint = None
    if "account" in low:  # "Invalid account or account/partition combination specified"
        hint = "Check `account` in the env.toml profile." + (
            f" Your accounts: {', '.join(facts.accounts)}." if facts and facts.accounts else ""
        )
    elif "partition" in low:
        hint = "Check `partition` in the env.toml profile." + (
            f" Partitions: {', '.join(facts.partitions)}." if facts and facts.partitions else ""
        )
    elif "time limit" in low:
        hint = "Lower `time` in the env.toml profile to what the partition allows (`sinfo -o '%P %l'`)."
    elif "node" in low and ("configuration" in low or "invalid" in low or "available" in low):
        hint = "Check `nodes`, `gpus_per_node` and sbatch_flags against what the partition has (`sinfo -N -l`)."
    return text, hint


# -- steps of a running job (`evaluate watch` hands each checkpoint's job script to its kept job) -------------


def start_step(remote: Remote, job_id: str, *, name: str, command: str, output: str) -> None:
    """Start `command` as a step named `name` of the running job `job_id` (`srun --jobid --overlap`: it shares
    the allocation's node, CPUs and GPUs with the job's other steps), detached from this connection: `srun`
    runs on under `setsid nohup`, its own messages go to `output`. Returns once srun is started; whether the
    step runs is `step_state`'s to say."""
    srun = shlex.join(
        [
            "srun",
            f"--jobid={job_id}",
            "--overlap",
            "--nodes=1",
            "--ntasks=1",
            f"--job-name={name}",
            "--kill-on-bad-exit=1",
            "bash",
            "-c",
            command,
        ]
    )
    log = shlex.quote(output)
    line = f"mkdir -p {shlex.quote(posixpath.dirname(output))} && setsid nohup {srun} >>{log} 2>&1 </dev/null &"
    result = remote.run(["sh", "-c", line], timeout=60, check=False)
    if not result.ok:
        raise ClusterError(f"Could not start a step of Slurm job {job_id}: {(result.stderr or result.stdout).strip()}")


STEP_FIELDS = "JobID,JobName,State,ExitCode,Elapsed,AllocTRES,Start"


def step_state(remote: Remote, job_id: str, name: str) -> SlurmJobState:
    """The state of the step named `name` of job `job_id` (its id `JOB.STEP` once Slurm knows it): squeue's
    while it runs, sacct's afterwards. Before Slurm knows the step: PENDING while the job runs (srun is asking
    for it), else the job's own end (the step can no longer start)."""
    jid = shlex.quote(str(job_id))
    script = (
        f"squeue -h -s -j {jid} -o '%i|%j' 2>/dev/null | sed 's/^/Q|/'; "
        f"sacct -n -P -j {jid} -o {STEP_FIELDS} 2>/dev/null | sed 's/^/A|/'; "
        f"squeue -h -j {jid} -o '%T' 2>/dev/null | sed 's/^/J|/'"
    )
    result = remote.run(["sh", "-c", script], timeout=60, check=False)
    running = accounted = None
    job_word = ""
    for line in result.stdout.splitlines():
        kind, _, rest = line.strip().partition("|")
        fields = rest.split("|")
        if kind == "Q" and len(fields) >= 2 and fields[1] == name:
            running = fields[0]
        elif kind == "A" and len(fields) >= 5 and fields[1] == name and "." in fields[0]:
            accounted = fields
        elif kind == "J" and fields[0]:
            job_word = _clean_state(fields[0])
    if running:
        return SlurmJobState(job_id=running, state="RUNNING")
    if accounted and _clean_state(accounted[2]) not in ACTIVE:
        return SlurmJobState(
            job_id=accounted[0], state=_clean_state(accounted[2]), exit_code=accounted[3], elapsed=accounted[4]
        )
    if job_word in ACTIVE:
        # sacct may still say RUNNING for a step squeue no longer lists: it is ending
        return SlurmJobState(
            job_id=accounted[0] if accounted else str(job_id),
            state="RUNNING" if accounted else "PENDING",
            reason="" if accounted else "starting its step in the kept job",
        )
    job = job_state(remote, job_id)
    if accounted:  # the job ended with the step: the job's end is the step's
        return SlurmJobState(job_id=accounted[0], state=job.state, exit_code=job.exit_code, elapsed=accounted[4])
    return SlurmJobState(
        job_id=str(job_id), state="UNKNOWN", reason=f"no step {name} in Slurm job {job_id} ({job.state.lower()})"
    )


def step_allocation(remote: Remote, job_id: str, name: str) -> dict[str, Any] | None:
    """The scheduler's accounting of the step named `name` of job `job_id` as `state/allocation.json`'s content
    (`job_allocation`'s fields): the step's own elapsed time, and the GPUs of the job's allocation it shares
    (the step's own AllocTRES when it lists them); None when sacct does not know it."""
    result = remote.run(["sacct", "-n", "-P", "-j", str(job_id), "-o", STEP_FIELDS], timeout=60, check=False)
    job_gpus = 0
    found = None
    for line in result.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 7:
            continue
        parsed = parse_sacct_allocation("|".join([fields[0], fields[4], fields[5], fields[6], fields[2]]))
        if parsed is None:
            continue
        if fields[0] == str(job_id):
            job_gpus = parsed["gpus"]
        elif fields[1] == name and "." in fields[0]:
            found = parsed
    if found is None:
        return None
    found["gpus"] = found["gpus"] or job_gpus
    found["kept_job"] = str(job_id)
    return found
