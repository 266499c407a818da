"""The cluster default deployment for real: `evaluate -c tiny --run CI deployment.backend=export-deploy
deployment.num_nodes=2 deployment.num_replicas=2` on the local Slurm cluster.

Real here: Slurm (two nodes of the allocation), the squash, the probe of the squashed image before anything
is queued, Ray from PyPI (head on rank 0, a worker on the other node, Ray Serve placing one replica on each
node's GPU), HTTP, the harness. A stand-in: Export-Deploy's script itself (tests/infra/export-deploy, the
real script's arguments and routes, ckpteval's builtin engine inside each replica) — the test image has it
where the NeMo container has Export-Deploy's, /opt/Export-Deploy (tests/infra/setup.sh installs it there).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.execution.slurm_state import slurm_job_id
from ckpteval.invocation.record import list_records, load_record
from tests.integration.conftest import REPO
from tests.integration.slurm_jobs import free_port, sacct_steps
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
runner = CliRunner()
STAND_IN = Path("/opt/Export-Deploy/scripts/deploy/llm/mlm/deploy_ray.py")
TASK = "hellaswag"  # log-likelihood scoring: every choice's log-probability decides the score


def cli(*argv: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(argv))
    # none of ours: the job's own log tail, quoted after a failure, may hold Ray's (a worker still joining
    # a head that rank 0's failure took away raises in `ray start`, seen at load 10-20)
    ours = result.output.split("last lines of its log")[0]
    assert "Traceback" not in ours and isinstance(result.exception, (SystemExit, type(None))), result.output
    return result


def ray_processes(user: str) -> list[str]:
    """The CI user's Ray processes on this machine (every node of the test cluster is this machine)."""
    out = subprocess.run(["ps", "-u", user, "-o", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "ray" in line.lower() and "<defunct>" not in line]


def wait_no_ray(user: str, timeout: float = 120) -> list[str]:
    """The CI user's Ray processes still there after `timeout` seconds (none, once they have all ended)."""
    with contextlib.suppress(AssertionError):  # the caller compares with [], and shows what is left
        wait_until(lambda: not ray_processes(user), timeout=timeout, what="Ray to stop", interval=1)
    return ray_processes(user)


def common_args(checkpoint: str) -> list[str]:
    return [
        "-c",
        "tiny",
        "-t",
        TASK,
        "deployment.prepare=null",
        f"run.model={checkpoint}",
        "evaluation.nemo_evaluator_config.config.params.limit_samples=4",
        "evaluation.nemo_evaluator_config.config.params.parallelism=4",
    ]


def export_deploy_args(env: Path, checkpoint: str, *extra: str) -> list[str]:
    return [
        *common_args(checkpoint),
        "--env-file",
        str(env),
        "deployment.backend=export-deploy",
        "deployment.num_nodes=2",
        "deployment.num_replicas=2",
        "deployment.image=nvcr.io/nvidia/nemo:25.11",
        f"deployment.port={free_port()}",
        # two fake "nodes" share this machine's CPUs: a replica asks Ray for one CPU, not Export-Deploy's 8
        "deployment.extra_args=--num_cpus_per_replica 1",
        # and its ports: each node's agents get their own (and the raylet need not wait for them to pick one)
        "deployment.ray_start_args='"
        + " ".join(
            f"--{name}=$(({base} + SLURM_PROCID))"
            for name, base in (
                ("dashboard-agent-grpc-port", 52500),
                ("dashboard-agent-listen-port", 52510),
                ("runtime-env-agent-port", 52520),
                ("metrics-export-port", 52530),
            )
        )
        + "'",
        *extra,
    ]


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(infra) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """Each test's two-node job is cancelled when the test ends, failed or not: a job left running would hold
    two of the cluster's three nodes for its whole time limit, and the next test's job would wait behind it."""
    yield
    for record in list_records():  # this test's own (each test has its own state directory)
        if slurm_job_id(record):
            subprocess.run(["scancel", str(slurm_job_id(record))], capture_output=True)


@pytest.fixture
def ray_profile(write_env_toml):  # type: ignore[no-untyped-def]
    """A profile whose jobs find this project's venv (python, ray) on PATH, as a NeMo image has its own;
    one fake GPU per node, so two nodes hold the two replicas."""
    venv_bin = REPO / ".venv" / "bin"
    return write_env_toml(
        "CI",
        python=str(venv_bin / "python"),
        nodes=2,
        gpus_per_node=1,
        time="00:15:00",
        env_vars={
            "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
        },
    )


def test_export_deploy_on_two_nodes_with_ray_scores_like_the_builtin_server(
    infra, ray_profile, tiny_checkpoint, tmp_path, monkeypatch
):  # type: ignore[no-untyped-def]
    assert STAND_IN.is_file(), "tests/infra/setup.sh installs Export-Deploy's stand-in; run it"
    assert not ray_processes(infra.ssh_user), "Ray processes of the CI user are already running"
    monkeypatch.chdir(tmp_path)

    run = cli(*export_deploy_args(ray_profile, tiny_checkpoint, "--run", "CI"))
    records = list_records()
    assert records, run.output  # submitted (nothing fails before the queue)
    (record,) = records
    job_dir = Path(record.job_dir)
    deployment_log = (job_dir / "logs" / "deployment.log").read_text(errors="replace")
    assert run.exit_code == 0, run.output + "\n" + deployment_log[-4000:]

    # the entry point was probed in the squashed image before submission, and cached beside it
    said = " ".join(run.output.split())  # the terminal wraps long lines
    assert "Export-Deploy entry point /opt/Export-Deploy/scripts/deploy/llm/mlm/deploy_ray.py (probed" in said
    (cache,) = (Path(record.job_dir).parent.parent / "containers").glob("*.export-deploy.json")
    assert json.loads(cache.read_text())["script"] == str(STAND_IN)
    script = (job_dir / "job.sh").read_text()
    assert "deploy_ray.py --megatron_checkpoint" in script and "--num_replicas 2" in script

    # Ray: the head on one node, a worker on the other, one replica answering from each
    assert "Ray cluster of 2 nodes; replicas answer from Slurm nodes node0,node1" in deployment_log
    steps = dict(sacct_steps(str(slurm_job_id(record))))
    assert "deployment" in steps

    # clean teardown: `ray stop` on every node, nothing of Ray left
    assert wait_no_ray(infra.ssh_user) == []

    # the same task, same checkpoint, served by the builtin server on this machine: the same scores
    builtin = cli(*common_args(tiny_checkpoint), "deployment.backend=builtin", f"deployment.port={free_port()}")
    assert builtin.exit_code == 0, builtin.output
    ours = json.loads(cli("results", record.id, "--json").stdout)["tasks"][TASK]
    local = next(r for r in list_records() if r.id != record.id)
    theirs = json.loads(cli("results", local.id, "--json").stdout)["tasks"][TASK]
    assert ours["n_samples"] == theirs["n_samples"] == 4
    values = {name: m["value"] for name, m in ours["metrics"].items()}
    assert values == {name: m["value"] for name, m in theirs["metrics"].items()} and values


def test_cancel_stops_ray_on_every_node(infra, ray_profile, tiny_checkpoint, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    submitted = cli(*export_deploy_args(ray_profile, tiny_checkpoint, "--batch", "CI"))
    assert submitted.exit_code == 0, submitted.output
    invocation = submitted.stdout.strip().splitlines()[-1]
    record = load_record(invocation)
    state = Path(record.job_dir) / "state" / "deployment"
    log = Path(record.job_dir) / "logs" / "deployment.log"
    # until it is ready, or has failed (then the assert below shows why, from the deployment's log); room for
    # more than one `ray start` on a busy machine
    wait_until(
        lambda: state.is_file() and state.read_text().strip() in ("ready", "failed"),
        timeout=540,
        what="the deployment to be ready or failed",
        interval=2,
        context=lambda: log.read_text(errors="replace")[-3000:] if log.is_file() else "(no deployment log)",
    )
    assert state.read_text().strip() == "ready", log.read_text()[-3000:]
    assert ray_processes(infra.ssh_user)  # Ray runs while the deployment does
    assert cli("cancel", invocation).exit_code == 0
    assert wait_no_ray(infra.ssh_user) == []


def test_a_deployment_failing_on_rank_0_fails_the_job_at_once_and_leaves_no_ray(
    infra, ray_profile, tiny_checkpoint, tmp_path, monkeypatch
):  # type: ignore[no-untyped-def]
    """Rank 0's script dies after the Ray cluster is up (here: an argument it refuses): the step ends at once
    (the worker rank is not left holding it), the job fails with the script's own words, and no Ray
    process is left on any node."""
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    failed = cli(
        *export_deploy_args(ray_profile, tiny_checkpoint, "--run", "CI"),
        "deployment.extra_args=--num_cpus_per_replica 1 --no_such_flag",
    )
    assert failed.exit_code != 0, failed.output
    (record,) = list_records()
    log = (Path(record.job_dir) / "logs" / "deployment.log").read_text(errors="replace")
    assert "unrecognized arguments: --no_such_flag" in log
    said = " ".join(failed.output.split())
    assert "exited before it became healthy" in said or "deployment failed" in said, failed.output
    assert time.monotonic() - start < 240, "the job waited for something after its deployment had failed"
    assert wait_no_ray(infra.ssh_user) == []
