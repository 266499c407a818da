"""`evaluate --batch/--run` on the real test cluster, end to end: the tiny Megatron checkpoint prepared and
served by the builtin server inside the Slurm job, a real task client (nemo-evaluator + lm-eval) in its
squashed eval-factory image through pyxis, the results brought back. And what a user sees for bad input."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.cluster.slurm import elapsed_seconds
from ckpteval.execution.slurm_state import slurm_job_id
from ckpteval.invocation.record import list_records, load_record
from tests.integration.conftest import REPO
from tests.integration.slurm_jobs import free_port, sacct_steps, wait_for
from tests.support.wandb_offline import offline_run_dirs, read_offline_run

pytestmark = pytest.mark.slurm
runner = CliRunner()


@pytest.fixture
def job_profile(write_env_toml):  # type: ignore[no-untyped-def]
    """An env.toml whose jobs run this project's venv on the nodes (the CI user can execute it)."""
    venv_bin = REPO / ".venv" / "bin"

    def write(**overrides):  # type: ignore[no-untyped-def]
        values = {
            "python": str(venv_bin / "python"),
            "nodes": 2,
            "gpus_per_node": 8,
            "env_vars": {
                "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
                "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1",
            },
            **overrides,
        }
        return write_env_toml("CI", **values)

    return write


def tiny_args(env: Path, *extra: str) -> list[str]:
    """The tiny random-weight checkpoint (byte tokenizer, 2048-token context: few-shot MMLU prompts do not
    fit) on HumanEval's zero-shot prompts, 3 problems, short completions: a real task in about a minute."""
    return [
        "-c",
        "tiny",
        "--env-file",
        str(env),
        "-t",
        "adlr_humaneval_greedy",
        "deployment.prepare=tiny",
        "run.model=${execution.cache_dir}/checkpoints/tiny",
        f"deployment.port={free_port()}",
        "evaluation.nemo_evaluator_config.config.params.limit_samples=3",
        "evaluation.nemo_evaluator_config.config.params.max_new_tokens=32",
        *extra,
    ]


def cli(*argv: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(argv))
    assert "Traceback" not in result.output, result.output
    return result


@pytest.mark.slow
def test_tiny_batch_deploys_in_the_job_and_brings_back_real_results(job_profile, infra, monkeypatch):
    env = job_profile(sbatch_flags={"hold": True})
    # the job exports its own results as it ends (offline here: a W&B run file in the job dir)
    monkeypatch.setenv("WANDB_MODE", "offline")
    submitted = cli(*tiny_args(env, "--batch", "CI", "export.wandb.enabled=true", "export.wandb.project=ckpteval-it"))
    assert submitted.exit_code == 0, submitted.output
    invocation = submitted.stdout.strip().splitlines()[-1]
    record = load_record(invocation)
    assert slurm_job_id(record) and f"submitted invocation {invocation}" in submitted.output
    job = str(slurm_job_id(record))

    held = json.loads(cli("status", invocation, "--json").stdout)[0]
    assert (held["state"], held["detail"]) == ("pending", "JobHeldUser")
    subprocess.run(["scontrol", "release", job], check=True)

    def state() -> str:
        return json.loads(cli("status", invocation, "--json").stdout)[0]["state"]

    wait_for(lambda: state() == "running", timeout=60, what="running")
    final = wait_for(lambda: (s := state()) not in ("pending", "running") and s, timeout=420, interval=3, what="end")
    shown = cli("status", invocation)
    assert final == "succeeded", shown.output + "\n".join(cli("logs", invocation).output.splitlines()[-40:])

    results = cli("results", invocation, "--json")
    assert results.exit_code == 0, results.output
    data = json.loads(results.stdout)
    task = data["tasks"]["adlr_humaneval_greedy"]
    assert data["status"] == "succeeded" and task["status"] == "succeeded"
    assert task["n_samples"] == 3
    (name, metric), *_ = task["metrics"].items()
    assert name.startswith("pass_at_1") and 0.0 <= metric["value"] <= 1.0  # the model's code, run and scored
    assert (Path(record.job_dir) / "results.json").is_file()  # written on the cluster too (same machine here)

    steps = sacct_steps(job)
    assert [n for n, _ in steps].count("deployment") == 1
    alloc = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job, "-o", "NNodes,AllocTRES"], capture_output=True, text=True
    )
    nodes, tres = alloc.stdout.strip().split("|")
    assert nodes == "2" and "gres/gpu=16" in tres  # 8 fake GPUs on each of the 2 nodes
    # its GPU-hours: the scheduler's accounting of the allocation (elapsed x GPUs allocated), split by the job's log
    elapsed = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "Elapsed"], capture_output=True, text=True)
    usage = data["usage"]
    wall = elapsed_seconds(elapsed.stdout.strip())
    assert (usage["source"], usage["gpus"], usage["wall_seconds"]) == ("sacct", 16, wall)
    assert usage["gpu_hours"] == round(wall * 16 / 3600, 6) > 0
    assert set(usage["phases"]) == {"startup", "tasks", "idle"} and usage["phases"]["tasks"] > 0
    assert abs(sum(usage["phases"].values()) - wall) <= 2  # the allocation's seconds, each in one phase
    assert f"used {usage['gpu_hours']:.3g} GPU-h (16 GPUs" in cli("status", invocation).output
    listed = json.loads(cli("status", invocation, "--json").output)
    assert [s["usage"]["gpu_hours"] for s in listed] == [usage["gpu_hours"]]  # the same numbers, for scripts
    log = cli("logs", invocation).output
    assert "deployment healthy" in log and "all tasks succeeded" in log
    client = cli("logs", invocation, "--source", "adlr_humaneval_greedy").output
    assert client.strip()
    assert ".sqsh" in Path(record.job_dir, "job.sh").read_text()  # the task ran in its squashed image

    (run_dir,) = offline_run_dirs(Path(record.job_dir))  # written by the job's export step
    run = read_offline_run(run_dir)
    assert (run.run_id, run.project) == (f"ckpteval-{invocation}", "ckpteval-it")
    assert run.summary[f"adlr_humaneval_greedy/{name}"] == metric["value"]
    assert run.summary["usage/gpus"] == 16 and run.summary["usage/gpu_hours"] > 0  # the allocation so far
    assert "exporting the results" in log


def test_dry_run_shows_sbatch_job_script_and_squash_plan_without_connecting(job_profile, monkeypatch):
    monkeypatch.setenv("COLUMNS", "500")  # long script lines unwrapped
    env = job_profile(host="cluster.invalid")  # nothing answers there: a dry run must not try
    shown = cli(*tiny_args(env, "--run", "CI", "--dry-run"))
    assert shown.exit_code == 0, shown.output
    text = " ".join(" ".join(line.strip().strip("│").split()) for line in shown.output.splitlines())
    for part in (
        "#SBATCH --job-name=ckpteval-",
        "#SBATCH --gres=gpu:8",
        "--nodes=1 --ntasks=1 --overlap",
        "srun --job-name=deployment",
        "Squash plan",
        "import if missing",
    ):
        assert part in text, part
    assert list_records() == []


@pytest.mark.parametrize(
    ("overrides", "message", "hint"),
    [
        ({"partition": "nosuch"}, "Partition 'nosuch' does not exist on", "Partitions there: batch"),
        ({"port": "FREE"}, "Cannot reach 127.0.0.1:", "Check the host and port"),
        ({"identity": "STRANGER"}, "SSH authentication failed for ciuser@127.0.0.1:2222", "identity"),
    ],
    ids=["unknown-partition", "unreachable-host", "failed-ssh-auth"],
)
def test_bad_cluster_input_is_one_clear_message(job_profile, tmp_path: Path, overrides, message, hint):  # type: ignore[no-untyped-def]
    if overrides.get("port") == "FREE":
        overrides = {"port": free_port()}
    if overrides.get("identity") == "STRANGER":
        key = tmp_path / "stranger"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        overrides = {"identity": str(key)}
    result = cli(*tiny_args(job_profile(**overrides), "--batch", "CI"))
    assert result.exit_code != 0
    assert message in result.output and hint in result.output, result.output
    assert list_records() == []  # nothing recorded, nothing submitted


def test_a_profile_python_without_ckpteval_is_refused_before_sbatch(job_profile, infra, remote_job_dir):
    # the builtin server runs `<python> -m ckpteval.server` on the node: the system python3 there has no ckpteval
    result = cli(*tiny_args(job_profile(python="/usr/bin/python3"), "--batch", "CI"))
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert (
        f"Profile [CI]: python = /usr/bin/python3 cannot import ckpteval on {infra.ssh_user}@127.0.0.1:"
        f"{infra.ssh_port} (ModuleNotFoundError: No module named 'ckpteval')"
    ) in text, text
    assert "Install ckpteval for that Python on the cluster" in text
    assert list_records() == []  # nothing recorded, so nothing submitted
    assert not os.path.exists(remote_job_dir)  # nothing uploaded or squashed either


def test_sbatch_rejection_is_one_clear_message_and_status_says_so(job_profile):
    result = cli(*tiny_args(job_profile(gpus_per_node=16), "--batch", "CI"))
    assert result.exit_code == 1
    assert "Slurm refused the job (sbatch):" in result.output
    assert "Requested node configuration is not available" in result.output
    (record,) = list_records()
    status = json.loads(cli("status", record.id, "--json").stdout)[0]
    assert status["state"] == "failed" and status["detail"].startswith("not submitted")


def test_the_real_cli_process_prints_no_traceback_for_an_unreachable_cluster(job_profile):
    env = job_profile(port=free_port())
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "evaluate"), *tiny_args(env, "--batch", "CI")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert proc.returncode == 1
    assert "Cannot reach 127.0.0.1:" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.slow
def test_run_attached_follows_the_job_and_prints_the_scores(job_profile):
    result = cli(*tiny_args(job_profile(nodes=1), "--run", "CI"))
    assert result.exit_code == 0, result.output
    output = result.output
    (record,) = list_records()
    assert f"following invocation {record.id}" in output
    assert "│ [ckpteval" in output and "deployment healthy" in output  # the job's log, streamed
    assert f"Slurm job {slurm_job_id(record)}: running" in output
    assert f"scores — invocation {record.id}" in output and "pass_at_1" in output
    saved = json.loads((record.path / "job" / "results.json").read_text())
    assert saved["status"] == "succeeded"
    assert cli("status", record.id, "--json").stdout.count('"succeeded"') >= 2  # the invocation and its task


def test_ctrl_c_while_following_leaves_the_job_running_without_a_terminal(job_profile):
    import signal
    import threading

    env = job_profile(nodes=1)
    proc = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "evaluate"), *tiny_args(env, "--run", "CI")],
        # as from a terminal: a test run started in the background (`cmd &` in a script) ignores SIGINT, the
        # CLI would inherit that, and Python turns SIGINT into KeyboardInterrupt only when it is not ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        wait_for(lambda: any("following invocation" in ln for ln in lines), timeout=180, what="the CLI to follow")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)  # generous: a loaded 2-core CI machine is slow to unwind an SSH session
        reader.join(timeout=10)
    finally:
        proc.kill()
    err = "".join(lines)
    (record,) = list_records()
    assert proc.returncode == 130, err
    assert f"left invocation {record.id} running (Slurm job {slurm_job_id(record)})" in err
    assert f"evaluate cancel {record.id}" in err and "Traceback" not in err
    assert json.loads(cli("status", record.id, "--json").stdout)[0]["state"] in ("pending", "running")
    assert cli("cancel", record.id).stdout.startswith(f"cancelled invocation {record.id}")
