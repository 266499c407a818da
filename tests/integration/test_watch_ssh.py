"""`evaluate watch` on a Slurm profile: the save dir on the cluster is listed over the real sshd, one
command (one round trip) per poll however many checkpoints it holds, and `--dry-run` shows the listing
and the Slurm job of the first checkpoint to evaluate."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.cluster.ssh import SSHRemote
from ckpteval.execution.slurm_state import slurm_job_id
from ckpteval.watch.run import SaveDirLister
from tests.integration.conftest import Infra
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slurm


def _write_saves(root: Path, infra: Infra, complete: list[int], half: list[int], like: Path | None = None) -> None:
    """Iteration dirs with the files Megatron's torch_dist writer leaves (owned by the CI user): `like`'s own
    files (a real checkpoint, which the check before submission reads), or placeholders for a listing."""
    source = like / "iter_0000000" if like else None
    for iteration in complete + half:
        path = root / f"iter_{iteration:07d}"
        path.mkdir(parents=True)
        names = ["common.pt", "__0_0.distcp"] + ([".metadata", "metadata.json"] if iteration in complete else [])
        for name in names:
            if source:
                shutil.copyfile(source / name, path / name)
            else:
                (path / name).write_bytes(b"x")
    (root / "latest_checkpointed_iteration.txt").write_text(str(max(complete)))
    if like:
        shutil.copytree(like / "tokenizer", root / "tokenizer")
    else:
        (root / "tokenizer").mkdir()
    user = pwd.getpwnam(infra.ssh_user)
    for dirpath, dirnames, filenames in os.walk(Path(root).parents[1]):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(name, user.pw_uid, user.pw_gid)


def test_one_round_trip_per_poll_whatever_the_number_of_checkpoints(
    ci_profile, infra: Infra, remote_job_dir, monkeypatch
):
    save_dir = Path(remote_job_dir) / "run42" / "checkpoints"
    _write_saves(save_dir, infra, complete=[i * 100 for i in range(1, 31)], half=[3100])
    calls: list[str] = []
    real_exec = SSHRemote._exec

    def counting(self, cmd, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(cmd)
        return real_exec(self, cmd, **kwargs)

    monkeypatch.setattr(SSHRemote, "_exec", counting)
    lister = SaveDirLister(ci_profile(), str(save_dir))
    try:
        first = lister()
        assert len(calls) == 1
        second = lister()  # the next poll: the same connection, one more command
        assert len(calls) == 2
    finally:
        lister.close()
    assert [c.iteration for c in first.ready] == [i * 100 for i in range(1, 31)]
    assert [c.iteration for c in first.incomplete] == [3100]
    assert first.tracker == "3000" and second == first
    assert str(save_dir) in calls[0]


def test_dry_run_lists_over_ssh_and_shows_the_slurm_job(write_env_toml, infra: Infra, remote_job_dir, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    save_dir = Path(remote_job_dir) / "run42" / "checkpoints"
    _write_saves(save_dir, infra, complete=[100, 200], half=[300])
    env = write_env_toml("CI", gpus_per_node=8)
    result = CliRunner().invoke(
        app,
        [
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
            "--dry-run",
        ],
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "iteration       100  ready: would evaluate now" in out
    assert "iteration       300  incomplete (missing .metadata, metadata.json)" in out
    # the builtin server is kept in one Slurm job, each checkpoint a step of it: one at a time by default
    assert "each loaded into it in place (the megatron/builtin server in one kept Slurm job" in out
    assert "would evaluate now: iteration 100, 200 (at most 1 at a time)" in out
    assert "#SBATCH" in out and f"{save_dir}/iter_0000100" in out


@pytest.mark.slow
def test_slurm_watch_submits_at_most_max_pending_held_jobs_once_each(
    write_env_toml, infra: Infra, remote_job_dir, tiny_checkpoint: str
):
    """Three ready checkpoints, --max-pending 2: two real Slurm jobs (held, so they never run), recorded with
    their iterations; a restarted watcher submits nothing again; a cancelled one is retried (attempt 2)."""
    import subprocess

    from ckpteval.invocation.record import load_record
    from ckpteval.watch.run import open_watch
    from ckpteval.watch.state import WatchSpec

    save_dir = Path(remote_job_dir) / "run42" / "checkpoints"
    _write_saves(save_dir, infra, complete=[100, 200, 300], half=[400], like=Path(tiny_checkpoint))
    venv_bin = Path(__file__).resolve().parents[2] / ".venv" / "bin"
    env = write_env_toml("CI", python=str(venv_bin / "python"), sbatch_flags={"hold": True})

    def spec() -> WatchSpec:
        return WatchSpec(
            save_dir=str(save_dir),
            configs=["tiny"],
            profile="CI",
            tasks=["adlr_humaneval_greedy"],
            overrides=["deployment.backend=builtin"],
            env_file=str(env),
            every=1,
            max_pending=2,
        )

    jobs: list[str] = []
    try:
        watcher = open_watch(spec())
        report = watcher.poll()
        assert report.submitted == [100, 200]
        assert watcher.lister.round_trips == 1  # type: ignore[attr-defined]
        entries = watcher.state.iterations
        for iteration in (100, 200):
            record = load_record(entries[iteration].attempts[0].invocation)
            jobs.append(str(slurm_job_id(record)))
            assert record.watch.iteration == iteration
            assert f"iter_{iteration:07d}" in " ".join(record.command_line)
        squeue = subprocess.run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%i %r"], capture_output=True, text=True)
        assert len(squeue.stdout.strip().splitlines()) == 2 and "JobHeldUser" in squeue.stdout

        # the watcher is "killed" (its lock goes with it); the same command again: the two in flight are
        # followed, not resubmitted
        watcher.close()
        again = open_watch(spec())
        assert again.poll().submitted == []
        # one of them is cancelled on the cluster: it is retried, and 300 still waits for a slot
        subprocess.run(["scancel", jobs[0]], check=True)

        def retried() -> bool:
            again.poll()
            return len(again.state.iterations[100].attempts) > 1

        wait_until(retried, timeout=180, what="a second attempt after the cancel", interval=1)
        first, second = again.state.iterations[100].attempts
        assert first.state == "cancelled" and second.invocation
        assert again.state.iterations[100].state == "submitted"
        assert again.state.iterations[300].state == "waiting"  # both slots taken again
        jobs.append(str(slurm_job_id(load_record(second.invocation))))
        assert 400 not in again.state.iterations
        again.close()
    finally:
        from ckpteval.watch.state import load_state, run_name

        state = load_state(run_name(str(save_dir), "CI"))
        for entry in list(state.iterations.values()) if state else []:
            for attempt in entry.attempts:
                if attempt.invocation:
                    record = load_record(attempt.invocation)
                    if slurm_job_id(record):
                        subprocess.run(["scancel", str(slurm_job_id(record))], check=False)
