"""The Slurm backend's transport for scripts that are no invocation (the cluster-hosted watcher's links), on
the real test cluster over SSH: a script submitted with its files, listed by its job name, stopped by the
signal its trap handles; and sbatch's refusal in one message. Each job runs a few seconds of bash."""

from __future__ import annotations

import posixpath
import subprocess
import uuid

import pytest

from ckpteval.errors import ClusterError
from ckpteval.execution.backends import script_host
from tests.integration.slurm_jobs import wait_for

pytestmark = pytest.mark.slurm


def _script(name: str, directory: str, *, partition: str, account: str) -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            f"#SBATCH --job-name={name}",
            f"#SBATCH --partition={partition}",
            f"#SBATCH --account={account}",
            f"#SBATCH --output={directory}/out-%j.log",
            "#SBATCH --time=00:05:00",
            "#SBATCH --ntasks=1",
            f"trap 'echo ended-on-usr1 > {directory}/ended; exit 0' USR1",
            f"cat {directory}/note.txt",
            "sleep 300 &",
            "wait",
            "",
        ]
    )


def test_a_script_goes_with_its_files_is_listed_by_name_and_ends_on_its_signal(ci_profile):
    profile = ci_profile()
    name = f"ckpteval-test-{uuid.uuid4().hex[:8]}"
    directory = posixpath.join(profile.part.remote_job_dir, "scripts")
    with script_host(profile) as host:
        files = {
            "run.sh": _script(name, directory, partition=profile.part.partition, account=profile.part.account),
            "note.txt": "the file that went along",
        }
        job = host.submit(directory, files, "run.sh", what="the test's job")
        try:
            running = wait_for(
                lambda: [j for j in host.jobs(name) if j.state == "RUNNING"], timeout=120, what="the job running"
            )
            assert [j.job_id for j in running] == [job.job_id] and running[0].node
            out = f"{directory}/out-{job.job_id}.log"
            wait_for(lambda: "the file that went along" in _cat(out), timeout=60, what="its trap set, its file read")
            host.cancel(running, signal="USR1")  # its script gets that signal (not scancel's TERM), and ends itself
            wait_for(lambda: host.jobs(name) == [], timeout=120, what="the job gone from the queue")
        finally:
            host.cancel_named(name)
    assert _cat(f"{directory}/ended") == "ended-on-usr1\n"  # the trap ran: a graceful stop, not a kill


def _cat(path: str) -> str:
    return subprocess.run(["cat", path], capture_output=True, text=True).stdout


def test_a_script_slurm_refuses_is_one_clear_error(ci_profile):
    profile = ci_profile()
    directory = posixpath.join(profile.part.remote_job_dir, "scripts")
    with script_host(profile) as host, pytest.raises(ClusterError) as err:
        host.submit(
            directory,
            {"run.sh": _script("refused", directory, partition="nowhere", account=profile.part.account)},
            "run.sh",
            what="the job",
        )
    assert err.value.message.startswith("Slurm refused the job (sbatch):")
    assert "partition" in err.value.message.lower() and err.value.hint and "partition" in err.value.hint
