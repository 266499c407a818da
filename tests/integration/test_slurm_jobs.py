"""One Slurm job per invocation on the real test cluster, submitted through nemo-run over SSH: what
`status`, `logs`, `cancel` and resubmission see. The deployment is a real HTTP server and the task clients
are shell commands (the real model and harness run in test_slurm_evaluate.py), so each job takes seconds.
"""

from __future__ import annotations

import dataclasses
import io
import posixpath
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ckpteval import api
from ckpteval.errors import ClusterError
from ckpteval.execution.slurm import SlurmBackend, SlurmJob
from ckpteval.execution.slurm_state import open_session, slurm_job_id, submission_of
from ckpteval.invocation.record import load_record
from tests.integration.slurm_jobs import (
    free_port,
    http_deployment,
    pid_alive,
    sacct_steps,
    shell_tasks,
    squeue_state,
    submit_plan,
    wait_for,
)

pytestmark = pytest.mark.slurm


def status_of(record):  # type: ignore[no-untyped-def]
    with SlurmBackend().attach(load_record(record.id)) as job:
        return job.status()


def cli_status(invocation: str) -> str:
    """What `evaluate status INVOCATION` prints."""
    from typer.testing import CliRunner

    from ckpteval.cli.main import app

    result = CliRunner().invoke(app, ["status", invocation], terminal_width=120)
    assert result.exit_code == 0, result.output
    return result.output


def test_held_job_is_pending_then_runs_every_task_against_one_deployment(ci_profile, infra):
    """pending (held, with Slurm's reason) -> running -> succeeded; one deployment step for all tasks,
    across the 2 nodes the job asked for; a task runs in its (squashed) container through pyxis."""
    from ckpteval.cluster.connect import connect_remote
    from ckpteval.cluster.images import ImageRef
    from ckpteval.cluster.squash import ensure_squashed

    profile = ci_profile()
    port = free_port()
    with connect_remote(profile) as remote:
        image = "nvcr.io/nvidia/eval-factory/lm-evaluation-harness:26.03"
        sqsh = ensure_squashed([ImageRef("evaluation.tasks[0].container", image)], profile, remote=remote).mapping[
            image
        ]
    probe = f"python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://127.0.0.1:{port}/v1/health\").read())'"

    def plan(job_dir: str):  # type: ignore[no-untyped-def]
        containerized = shell_tasks(job_dir, [("in_container", f"echo image=$FAKE_PYXIS_IMAGE; {probe}")], image=sqsh)
        plain = shell_tasks(
            job_dir, [("second", f"sleep 3; echo gpus=$CUDA_VISIBLE_DEVICES; {probe}"), ("third", probe)]
        )
        return http_deployment(job_dir, port), containerized + plain

    sub = submit_plan(profile, plan, nodes=2, extra_flags={"hold": True})
    job = str(slurm_job_id(sub.record))

    held = status_of(sub.record)
    assert held.state == "pending"
    assert held.detail == "JobHeldUser"  # Slurm's reason, as squeue gives it
    assert [t.state for t in held.snapshot.tasks] == ["pending"] * 3

    subprocess.run(["scontrol", "release", job], check=True)
    running = wait_for(lambda: (s := status_of(sub.record)).state == "running" and s, timeout=60, what="running")
    assert running.detail == ""
    done = wait_for(
        lambda: (s := status_of(sub.record)).state not in ("running", "pending") and s, timeout=120, what="end"
    )
    assert done.state == "succeeded", done.log_tail
    assert [t.state for t in done.snapshot.tasks] == ["succeeded"] * 3
    # the job wrote when it ended, so `status` (from the status it kept, no connection) says how long it took
    took = re.search(r"took: (\S.*)$", cli_status(sub.record.id), re.M)
    assert done.snapshot.ended and took and re.fullmatch(r"\d+s|\d+m \d\ds|\d+h \d\dm", took.group(1)), took

    steps = sacct_steps(job)
    names = [name for name, _ in steps]
    assert names.count("deployment") == 1  # deployed once for three tasks
    assert {"task-in_container", "task-second", "task-third"} <= set(names)
    assert all(state == "COMPLETED" for name, state in steps if name.startswith("task-"))
    nodes = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "NNodes"], capture_output=True, text=True)
    assert nodes.stdout.strip() == "2"

    log = "\n".join(api.logs(load_record(sub.record.id)))
    assert "deployment healthy" in log and "all tasks succeeded" in log
    client = "\n".join(api.logs(load_record(sub.record.id), source="in_container"))
    assert f"image={sqsh}" in client  # the fake pyxis ran the step in the .sqsh we squashed
    assert "b'ok\\n'" in client  # and the client reached the deployment
    assert "gpus=0,1,2,3,4,5,6,7" in "\n".join(api.logs(load_record(sub.record.id), source="second"))


def test_tasks_run_as_steps_side_by_side_and_cancel_stops_them_all(ci_profile):
    """max_parallel_tasks=3: three task steps (srun --overlap) at once against the one deployment, each
    with its own state and log; one failing stops none; then a second job: cancel stops every task step."""
    profile = ci_profile()
    port = free_port()

    def span(name: str, tail: str = "true") -> tuple[str, str]:
        return name, f"date +%s.%N > $TASK_NAME.start; sleep 4; date +%s.%N > $TASK_NAME.end; {tail}"

    def plan(job_dir: str):  # type: ignore[no-untyped-def]
        tasks = [span("a"), span("b"), span("c", "exit 5")]
        return http_deployment(job_dir, port), shell_tasks(job_dir, [(n, f"cd {job_dir}; {c}") for n, c in tasks])

    sub = submit_plan(profile, plan, max_parallel_tasks=3)
    done = wait_for(
        lambda: (s := status_of(sub.record)).state not in ("running", "pending") and s, timeout=120, what="end"
    )
    assert done.state == "failed"
    assert [t.state for t in done.snapshot.tasks] == ["succeeded", "succeeded", "failed 5"]
    assert done.snapshot.tasks[2].log == "tasks/c/client.log"  # status says where to look

    def read(name: str) -> float:
        path = posixpath.join(sub.record.job_dir, name)
        return float(subprocess.run(["cat", path], capture_output=True, text=True, check=True).stdout)

    spans = [(read(f"{n}.start"), read(f"{n}.end")) for n in "abc"]
    assert max(start for start, _ in spans) < min(end for _, end in spans)  # all three ran at the same time
    steps = sacct_steps(str(slurm_job_id(sub.record)))
    assert {"task-a", "task-b", "task-c"} <= {name for name, _ in steps}
    assert [name for name, _ in steps].count("deployment") == 1

    def long_plan(job_dir: str):  # type: ignore[no-untyped-def]
        tasks = [(n, f"echo $$ > {job_dir}/{n}.pid; sleep 300") for n in ("x", "y")]
        return http_deployment(job_dir, port), shell_tasks(job_dir, tasks)

    second = submit_plan(profile, long_plan, max_parallel_tasks=2)
    wait_for(
        lambda: (s := status_of(second.record)).snapshot and all(t.state == "running" for t in s.snapshot.tasks),
        timeout=90,
        what="both tasks running",
    )

    def pids() -> list[int] | None:  # once both clients have started inside their steps
        found = [
            subprocess.run(["cat", posixpath.join(second.record.job_dir, f"{n}.pid")], capture_output=True).stdout
            for n in ("x", "y")
        ]
        return [int(p) for p in found] if all(p.strip() for p in found) else None

    clients = wait_for(pids, timeout=60, what="both clients started")
    assert api.cancel(load_record(second.record.id)).startswith("cancelled invocation")
    wait_for(lambda: not any(pid_alive(p) for p in clients), timeout=30, what="every task client to exit")


def test_cancel_stops_the_job_and_its_deployment(ci_profile):
    profile = ci_profile()
    port = free_port()

    def plan(job_dir: str):  # type: ignore[no-untyped-def]
        return http_deployment(job_dir, port), shell_tasks(
            job_dir, [("long", "echo started; sleep 300"), ("never", "true")]
        )

    sub = submit_plan(profile, plan)
    record = sub.record
    # the client starts with the deployment (and waits for it): wait for both
    wait_for(
        lambda: (
            (s := status_of(record)).snapshot
            and s.snapshot.deployment == "ready"
            and s.snapshot.tasks[0].state == "running"
        ),
        timeout=90,
        what="the deployment ready and the task running",
    )
    deploy_pid = int(
        subprocess.run(["cat", posixpath.join(record.job_dir, "deploy.pid")], capture_output=True, text=True).stdout
    )
    assert pid_alive(deploy_pid)

    message = api.cancel(load_record(record.id))
    assert message.startswith(f"cancelled invocation {record.id}")
    assert squeue_state(str(slurm_job_id(record))) == ""  # gone from the queue when cancel returns
    after = status_of(record)
    assert after.state == "cancelled"
    # the task it stopped and the one it never started (resume runs it still) read cancelled, as does the deployment
    assert [t.state for t in after.snapshot.tasks] == ["cancelled", "cancelled"]
    shown = cli_status(record.id)
    rows = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in shown.splitlines() if ln.startswith("│")}
    assert shown.split()[1] == "cancelled" and "running" not in shown and "ready" not in shown, shown
    assert rows == {"deployment": "cancelled", "long": "cancelled", "never": "cancelled"}, shown
    wait_for(lambda: not pid_alive(deploy_pid), timeout=30, what="the deployment process to exit")
    assert api.cancel(load_record(record.id)).startswith(f"invocation {record.id} is not running")


def test_failed_deployment_is_reported_failed_with_its_log_tail(ci_profile):
    from typer.testing import CliRunner

    from ckpteval.cli.main import app

    profile = ci_profile()

    def plan(job_dir: str):  # type: ignore[no-untyped-def]
        deployment = dataclasses.replace(
            http_deployment(job_dir, free_port()),
            step=dataclasses.replace(
                http_deployment(job_dir, 1).step, command="echo 'RuntimeError: CUDA out of memory (simulated)'; exit 1"
            ),
        )
        return deployment, shell_tasks(job_dir, [("a", "true")])

    sub = submit_plan(profile, plan)
    status = wait_for(
        lambda: (s := status_of(sub.record)).state not in ("pending", "running") and s, timeout=90, what="end"
    )
    assert status.state == "failed"
    assert status.detail == "the deployment failed"
    assert "CUDA out of memory (simulated)" in status.log_tail
    assert status.snapshot.tasks[0].state == "pending"  # never started

    shown = CliRunner().invoke(app, ["status", sub.record.id])
    assert shown.exit_code == 0, shown.output
    assert "failed" in shown.output and "CUDA out of memory (simulated)" in shown.output


def test_resubmitted_job_skips_finished_tasks(ci_profile):
    profile = ci_profile()

    def plan(job_dir: str):  # type: ignore[no-untyped-def]
        return http_deployment(job_dir, free_port()), shell_tasks(
            job_dir,
            [("first", f"echo run >> {job_dir}/first.count"), ("second", f"test -f {job_dir}/fixed")],
        )

    sub = submit_plan(profile, plan)
    record = sub.record
    first = wait_for(lambda: (s := status_of(record)).state not in ("pending", "running") and s, timeout=90, what="end")
    assert first.state == "failed" and first.detail == "failed: second"
    subprocess.run(["runuser", "-u", "ciuser", "--", "touch", posixpath.join(record.job_dir, "fixed")], check=True)

    assert api.resume(record.id).exit_status == 0
    resumed = load_record(record.id)
    assert slurm_job_id(resumed) != slurm_job_id(record)
    assert submission_of(resumed).job_ids == [slurm_job_id(record), slurm_job_id(resumed)]
    second = wait_for(
        lambda: (s := status_of(resumed)).state not in ("pending", "running") and s, timeout=90, what="end"
    )
    assert second.state == "succeeded", second.log_tail
    count = subprocess.run(["cat", posixpath.join(record.job_dir, "first.count")], capture_output=True, text=True)
    assert count.stdout == "run\n"  # the finished task did not run again
    log = "\n".join(api.logs(resumed))
    assert "task first: already done, skipped" in log


def test_sbatch_rejection_is_one_clear_error_and_recorded(ci_profile):
    profile = ci_profile()
    with pytest.raises(ClusterError) as err:
        submit_plan(
            profile, lambda d: (http_deployment(d, free_port()), shell_tasks(d, [("a", "true")])), gpus_per_node=16
        )
    assert err.value.message.startswith("Slurm refused the job (sbatch):")
    assert "Requested node configuration is not available" in err.value.message
    assert err.value.hint and "gpus_per_node" in err.value.hint
    from ckpteval.invocation.record import list_records

    (record,) = list_records()
    status = api.status(record)
    assert status.state == "failed" and status.detail.startswith("not submitted: Slurm refused the job")


def test_job_that_cannot_start_is_pending_with_slurms_reason(ci_profile):
    profile = ci_profile()
    sub = submit_plan(profile, lambda d: (http_deployment(d, free_port()), shell_tasks(d, [("a", "true")])), nodes=5)
    try:
        status = status_of(sub.record)
        # 5 nodes on a 3-node partition: Slurm says PartitionConfig, then PartitionNodeLimit once it has looked
        assert status.state == "pending" and status.detail in ("PartitionConfig", "PartitionNodeLimit")
        assert status.snapshot.deployment == "" and status.snapshot.tasks[0].state == "pending"
    finally:
        api.cancel(load_record(sub.record.id))


def test_failed_ssh_login_in_nemo_run_is_a_cluster_error(ci_profile, tmp_path: Path):
    """nemo-run exits the process when it cannot log in; submit() says what failed instead."""
    from ckpteval.cluster.nemorun import submit
    from ckpteval.cluster.sbatch import SbatchSpec, tunnel_dir_for

    stranger = tmp_path / "not_authorized_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    profile = ci_profile(identity=str(stranger))
    spec = SbatchSpec(
        invocation="0badc0de",
        job_script="/nonexistent/job.sh",
        tunnel_dir=tunnel_dir_for(profile.part.remote_job_dir),
        account=profile.part.account,
        partition=profile.part.partition,
        nodes=1,
        gpus_per_node=0,
        time="00:01:00",
    )
    with pytest.raises(ClusterError) as err:
        submit(spec, profile, log_path=tmp_path / "nemo-run.log")
    assert "could not log in" in err.value.message


def test_following_survives_a_dropped_ssh_connection(ci_profile):
    """Kill the sshd process serving our connection while following: it reconnects and follows to the end."""
    from ckpteval.execution.events import LogLines

    profile = ci_profile()

    def plan(job_dir: str):  # type: ignore[no-untyped-def]
        return http_deployment(job_dir, free_port()), shell_tasks(
            job_dir, [("slow", "for i in 1 2 3 4 5 6; do echo tick $i; sleep 1; done; sleep 4")]
        )

    sub = submit_plan(profile, plan)
    record = load_record(sub.record.id)
    out = io.StringIO()

    def report(event: object) -> None:  # the job's log lines, as the CLI prints them
        if isinstance(event, LogLines):
            out.write("".join(line + "\n" for line in event.lines))

    notes: list[str] = []
    session = open_session(record, on_reconnect=notes.append)
    job = SlurmJob(record, session)
    result: dict[str, object] = {}

    def run() -> None:
        try:
            job.follow(report)
            result["state"] = job.final
        except BaseException as exc:  # reported by the assertions below
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: "task slow: running" in out.getvalue(), timeout=90, what="the job's log to stream")
    killed = _kill_server_side_of(session)
    assert killed, "found no sshd process serving our connection"
    thread.join(timeout=120)
    session.close()
    assert not thread.is_alive()
    assert "error" not in result, result.get("error")
    assert result["state"].state == "COMPLETED"  # type: ignore[union-attr]
    assert session.reconnects >= 1 and any("reconnected" in n for n in notes)
    text = out.getvalue()
    assert "slow: succeeded" in text and "all tasks succeeded" in text  # nothing of the log was lost
    assert len(re.findall("task slow: running", text)) == 1  # nor printed twice


def _kill_server_side_of(session) -> list[int]:  # type: ignore[no-untyped-def]
    """SIGKILL the sshd processes whose TCP peer is our connection's local port (only ours)."""
    sock = session.remote._clients[-1].get_transport().sock  # type: ignore[attr-defined]
    port = sock.getsockname()[1]
    ss = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True).stdout
    pids = []
    for line in ss.splitlines():
        cols = line.split()
        if len(cols) >= 5 and cols[3].endswith(f":{port}") and "sshd" in line:
            pids += [int(p) for p in re.findall(r"pid=(\d+)", line)]
    for pid in pids:
        subprocess.run(["kill", "-KILL", str(pid)], check=False)
    time.sleep(0.5)
    return pids


def test_on_the_login_node_a_local_tunnel_submits_and_reads_without_ssh(
    ci_profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """tunnel = "local": nemo-run's LocalTunnel submits with this machine's sbatch (which exports our
    environment to the job, credentials taken out), and files are read directly."""
    monkeypatch.setenv("WANDB_API_KEY", "local-secret-0123456789")
    profile = ci_profile(
        tunnel="local", host=None, port=None, user=None, identity=None, remote_job_dir=str(tmp_path / "rjd")
    )
    sub = submit_plan(
        profile,
        lambda d: (
            http_deployment(d, free_port()),
            shell_tasks(d, [("a", 'echo "local-ok key=${WANDB_API_KEY:-unset}"')]),
        ),
    )
    status = wait_for(
        lambda: (s := status_of(sub.record)).state not in ("pending", "running") and s, timeout=90, what="end"
    )
    assert status.state == "succeeded", status.log_tail
    assert "local-ok key=unset" in "\n".join(api.logs(load_record(sub.record.id), source="a"))
    assert (tmp_path / "rjd" / "evaluations" / sub.record.id / "state" / "finished").read_text() == "0\n"


def test_a_ssh_config_alias_is_enough_for_submission(ci_profile, infra):
    """host = a ~/.ssh/config alias (HostName, Port, User, IdentityFile there): our SSH and nemo-run's
    (fabric, and rsync over the ssh command) both find their way."""
    profile = ci_profile(host=infra.ssh_alias, port=None, user=None, identity=None)
    sub = submit_plan(profile, lambda d: (http_deployment(d, free_port()), shell_tasks(d, [("a", "echo via-alias")])))
    status = wait_for(
        lambda: (s := status_of(sub.record)).state not in ("pending", "running") and s, timeout=90, what="end"
    )
    assert status.state == "succeeded", status.log_tail
    assert "via-alias" in "\n".join(api.logs(load_record(sub.record.id), source="a"))
