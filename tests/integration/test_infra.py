"""The test cluster keeps its promises: nodes, GPUs, pyxis and enroot stand-ins, the CI user's python."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, SETUP_SCRIPT, Infra
from tests.support.waiting import wait_until


def ssh(infra: Infra, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a command on the "login node" as the CI user with the ssh CLI, as nemo-run would."""
    return subprocess.run(
        [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-F",
            infra.ssh_config,
            "-o",
            f"UserKnownHostsFile={infra.ssh_known_hosts}",
            infra.ssh_alias,
            command,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_three_nodes_with_eight_gpus_each(infra: Infra):
    out = ssh(
        infra,
        f"srun -A {infra.slurm_account} -N{infra.slurm_nodes} --ntasks-per-node=1 "
        f"--gpus-per-node={infra.gpus_per_node} bash -c 'echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES'",
    )
    assert out.returncode == 0, out.stderr
    lines = sorted(out.stdout.split("\n")[:-1])
    assert lines == [f"node{i} 0,1,2,3,4,5,6,7" for i in range(infra.slurm_nodes)]


def test_fake_pyxis_checks_the_image_and_mounts(infra: Infra, remote_job_dir):
    sqsh = f"{remote_job_dir}/img.sqsh"
    made = ssh(
        infra,
        f"mkdir -p {remote_job_dir}/src && echo hi > {remote_job_dir}/src/f && "
        f"enroot import -o {sqsh} docker://ubuntu:{uuid.uuid4().hex[:8]}",
    )
    assert made.returncode == 0, made.stderr
    ok = ssh(
        infra,
        f"srun -A {infra.slurm_account} --container-image={sqsh} "
        f"--container-mounts={remote_job_dir}/src:/mnt/data --container-workdir=/mnt/data "
        "bash -c 'echo $FAKE_PYXIS_IMAGE; pwd; cat f'",
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split("\n")[:3] == [sqsh, "/mnt/data", "hi"]
    Path(f"{remote_job_dir}/not.sqsh").write_text("not squashfs")
    bad = ssh(infra, f"srun -A {infra.slurm_account} --container-image={remote_job_dir}/not.sqsh true")
    assert bad.returncode != 0
    assert "is not a squashfs file" in bad.stderr


def test_ci_user_runs_the_project_python_in_a_job(infra: Infra):
    python = Path(sys.executable)
    out = ssh(
        infra,
        f"cd {REPO} && srun -A {infra.slurm_account} {python} -c 'import ckpteval, paramiko; print(ckpteval.__name__)'",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ckpteval"


def test_setup_makes_a_venv_on_an_interpreter_in_a_private_home_runnable(infra: Infra):
    """As with a pyenv or uv-managed Python under root's 0700 home: `setup.sh project` opens the way."""
    if os.geteuid() != 0:
        pytest.skip("setup.sh changes permissions as root")
    base = Path(tempfile.mkdtemp(prefix="ckpteval-venv-", dir="/tmp"))
    try:
        base.chmod(0o755)
        private = base / "home"  # a user's home, 0700
        (private / "py" / "bin").mkdir(parents=True)
        (private / "py" / "bin" / "python3.11").symlink_to("/usr/bin/python3.11")
        (private / "py" / "bin" / "python3").symlink_to("python3.11")
        private.chmod(0o700)
        project = base / "project"
        (project / ".venv" / "bin").mkdir(parents=True)
        python = project / ".venv" / "bin" / "python"
        python.symlink_to(private / "py" / "bin" / "python3")  # what uv writes
        run_as_ci_user = ["runuser", "-u", infra.ssh_user, "--", str(python), "-c", "print('ok')"]
        assert subprocess.run(run_as_ci_user, capture_output=True, check=False).returncode != 0

        def setup() -> subprocess.CompletedProcess[str]:
            env = {**os.environ, "PROJECT_DIR": str(project), "CI_USER": infra.ssh_user}
            return subprocess.run(
                ["bash", str(SETUP_SCRIPT), "project"], capture_output=True, text=True, env=env, check=False
            )

        first = setup()
        assert first.returncode == 0, first.stderr
        assert f"made {private} traversable by others (o+x) so {infra.ssh_user} can reach {python}" in first.stdout
        assert private.stat().st_mode & 0o777 == 0o701  # search only: the CI user cannot list it
        ran = subprocess.run(run_as_ci_user, capture_output=True, text=True, check=False)
        assert (ran.returncode, ran.stdout) == (0, "ok\n"), ran.stderr
        again = setup()
        assert (again.returncode, again.stdout) == (0, "")  # nothing left to change
    finally:
        shutil.rmtree(base)


def test_jobs_show_in_accounting(infra: Infra):
    out = ssh(infra, f"sbatch --parsable -A {infra.slurm_account} -o /dev/null --wrap 'srun true'")
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()

    def state() -> str:
        return subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"], capture_output=True, text=True, check=False
        ).stdout.strip()

    wait_until(lambda: state() == "COMPLETED", timeout=240, what=f"job {job} to complete", interval=0.5, context=state)
