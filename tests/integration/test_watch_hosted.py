"""`evaluate watch ... --detach`: the watcher as a self-chaining CPU-only Slurm job on the real test cluster.

It lists the save dir on the node, submits the tiny evaluations with sbatch from inside its allocation,
resubmits itself ahead of its 2-minute time limit (Slurm's USR1, 60 s ahead) and exits; every checkpoint is
evaluated exactly once across the links. `scancel` of it then a restart by the user re-evaluates nothing;
`watch status` and `watch stop` reach it over SSH."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.watch.hosted import LINKS_FILE, job_name
from tests.integration.conftest import REPO, Infra
from tests.integration.slurm_jobs import free_port, wait_for
from tests.integration.test_watch_ssh import _write_saves

pytestmark = pytest.mark.slurm
runner = CliRunner()


def cli(*argv: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(argv))
    assert "Traceback" not in result.output, result.output
    return result


def _jobs(name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "--name", name, "-o", "%i %T"], capture_output=True, text=True).stdout
    return out.strip().splitlines()


def _save_next(save_dir: Path, iteration: int, like: Path, infra: Infra) -> None:
    """The training saves one more checkpoint: written under a temporary name, then renamed (complete at once)."""
    import pwd
    import shutil

    tmp = save_dir / f".tmp_iter_{iteration:07d}"
    shutil.copytree(like / "iter_0000000", tmp)
    user = pwd.getpwnam(infra.ssh_user)
    for path in [tmp, *tmp.iterdir()]:
        shutil.chown(path, user.pw_uid, user.pw_gid)
    tmp.rename(save_dir / f"iter_{iteration:07d}")


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(1500)
def test_the_watcher_on_the_cluster_chains_itself_and_evaluates_each_checkpoint_once(
    write_env_toml, infra: Infra, remote_job_dir: str, tiny_checkpoint: str, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "400")
    save_dir = Path(remote_job_dir) / "run42" / "checkpoints"
    _write_saves(save_dir, infra, complete=[100], half=[], like=Path(tiny_checkpoint))
    venv_bin = REPO / ".venv" / "bin"
    env = write_env_toml(
        "CI",
        python=str(venv_bin / "python"),
        nodes=1,
        env_vars={
            "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
        },
        watch_time="00:02:00",
        watch_signal_lead=60,
    )
    args = [
        "watch",
        str(save_dir),
        "-c",
        "tiny",
        "--run",
        "CI",
        "--env-file",
        str(env),
        "-t",
        "adlr_humaneval_greedy",
        "deployment.backend=builtin",
        f"deployment.port={free_port()}",
        "evaluation.nemo_evaluator_config.config.params.limit_samples=3",
        "evaluation.nemo_evaluator_config.config.params.max_new_tokens=32",
        "--every",
        "5",
        "--follow-every",
        "5",
        "--max-pending",
        "1",
        "--detach",
    ]
    dry = cli(*args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "#SBATCH --signal=B:USR1@60" in dry.output and "#SBATCH --cpus-per-task=1" in dry.output
    assert 'tunnel = "local"' in dry.output and "gres" not in dry.output
    run = dry.output.split("watch run ", 1)[1].split(":", 1)[0].strip()
    name = job_name(run)
    assert _jobs(name) == []  # the dry run submitted nothing

    home = Path(remote_job_dir) / "watch" / run
    try:
        submitted = cli(*args)
        assert submitted.exit_code == 0, submitted.output
        assert f"watch run {run}" in submitted.output

        def status() -> dict:  # over SSH, as from the user's laptop
            shown = cli("watch", "status", run, "--json")
            assert shown.exit_code == 0, shown.output
            return json.loads(shown.stdout)

        def links() -> list[str]:
            path = home / LINKS_FILE
            return path.read_text().splitlines() if path.is_file() else []

        wait_for(lambda: any(j.endswith("RUNNING") for j in _jobs(name)), timeout=60, what="the watcher running")
        # the training writes its next checkpoint while the first link runs
        _save_next(save_dir, 200, Path(tiny_checkpoint), infra)

        def done() -> bool:
            state = status()["state"]
            its = (state or {}).get("iterations", {})
            return len(links()) >= 3 and all(its.get(k, {}).get("state") == "succeeded" for k in ("100", "200"))

        wait_for(done, timeout=1200, interval=5, what="two chains and both checkpoints evaluated")
        shown = status()
        chained = [line for line in links() if "chained by" in line]
        assert len(chained) >= 2, links()
        for key in ("100", "200"):
            assert len(shown["state"]["iterations"][key]["attempts"]) == 1  # exactly once across the links
        human = cli("watch", "status", run)
        assert "Slurm job" in human.output and "link(s) of the chain" in human.output

        # scancel of the watcher itself: it ends, no next link; the user starts it again: nothing re-evaluated
        subprocess.run(["scancel", "--name", name], check=True)
        wait_for(lambda: _jobs(name) == [], timeout=90, what="the watcher gone after scancel")
        polls = shown["state"]["polls"]
        again = cli(*args)
        assert again.exit_code == 0, again.output
        wait_for(lambda: (status()["state"] or {}).get("polls", 0) > polls + 1, timeout=120, what="polls again")
        stopped = cli("watch", "stop", run, "--timeout", "60")
        assert stopped.exit_code == 0 and "stopped the watcher" in stopped.output, stopped.output
        assert _jobs(name) == []
        final = status()["state"]["iterations"]
        assert {k: len(v["attempts"]) for k, v in final.items()} == {"100": 1, "200": 1}
    finally:
        subprocess.run(["scancel", "--name", name], check=False)
        state_file = home / "state" / "watch" / run / "state.json"
        recorded = json.loads(state_file.read_text())["iterations"] if state_file.is_file() else {}
        for entry in recorded.values():  # the evaluations go on without their watcher: ours end with the test
            for attempt in entry["attempts"]:
                if attempt.get("invocation"):
                    subprocess.run(["scancel", "--name", f"ckpteval-{attempt['invocation']}"], check=False)
        log = "\n".join(p.read_text()[-3000:] for p in sorted(home.glob("watcher-*.out"))) if home.is_dir() else ""
        print(log)


def test_a_cluster_python_without_ckpteval_is_refused_before_anything_is_submitted(
    write_env_toml, infra: Infra, remote_job_dir: str
):
    env = write_env_toml("CI", watch_python="/usr/bin/python3")  # the system's: no ckpteval there
    save_dir = f"{remote_job_dir}/run42/checkpoints"
    result = cli("watch", save_dir, "-c", "tiny", "--run", "CI", "--env-file", str(env), "--detach")
    assert result.exit_code == 2, result.output
    assert "watch_python = /usr/bin/python3" in result.output and "cannot import ckpteval" in result.output
    from ckpteval.watch.state import run_name

    assert _jobs(job_name(run_name(save_dir, "CI"))) == []
    assert not (Path(remote_job_dir) / "watch").exists()
