"""The cluster-hosted watcher (`evaluate watch ... --detach`): its sbatch script and files (pure), and one
link's chain logic on the time limit's signal, run for real with a stand-in `sbatch` on PATH."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.config.profiles import Profile, load_env_file, make_profile
from ckpteval.errors import ConfigError
from ckpteval.execution.backend import ScriptJob
from ckpteval.watch import hosted
from ckpteval.watch import run as watch_run
from ckpteval.watch.run import WatchOutcome
from ckpteval.watch.state import WatchSpec, run_name, stop_file
from tests.support.waiting import wait_until

runner = CliRunner()
PROFILE = make_profile(
    name="CL",
    host="login.example",
    user="me",
    account="acct",
    partition="gpu",
    remote_job_dir="/lustre/me/ckpteval",
    python="/opt/venv/bin/python",
    env_vars={"HF_HOME": "/lustre/hf"},
    sbatch_flags={"exclusive": True},
    watch_partition="cpu",
    watch_time="12:00:00",
    watch_signal_lead=600,
)


def _env(tmp_path: Path, **keys: object) -> Path:
    lines = ["[CL]"] + [f"{k} = {str(v).lower() if isinstance(v, bool) else json.dumps(v)}" for k, v in keys.items()]
    path = tmp_path / "env.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _spec(env: Path, save_dir: str = "/lustre/run42/checkpoints", **kw: object) -> WatchSpec:
    return WatchSpec(save_dir=save_dir, configs=["tiny"], profile="CL", tasks=[], overrides=[], env_file=str(env), **kw)


def _hosted(profile: Profile = PROFILE) -> hosted.HostedWatch:
    spec = WatchSpec(save_dir="/lustre/run42/checkpoints", configs=["tiny"], profile="CL", tasks=[], overrides=[])
    run = run_name(spec.save_dir, "CL")
    return hosted.HostedWatch(run, profile, hosted.hosted_home(profile, run), spec, {})


def test_the_watcher_script_is_a_one_cpu_job_that_signals_itself_ahead_of_its_limit():
    h = _hosted()
    script = hosted.render_watcher_script(h)
    home = f"/lustre/me/ckpteval/watch/{h.run}"
    for line in (
        f"#SBATCH --job-name=ckpteval-watch-{h.run}",
        "#SBATCH --partition=cpu",  # watch_partition, not the evaluations' partition
        "#SBATCH --account=acct",
        "#SBATCH --time=12:00:00",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --signal=B:USR1@600",
        "#SBATCH --dependency=singleton",  # one link at a time
        "#SBATCH --requeue",
        f"export CKPTEVAL_STATE_DIR={home}/state",
        f"exec /opt/venv/bin/python -m ckpteval.watch.hosted {home}",  # the Python is the batch shell: B: reaches it
    ):
        assert line in script.splitlines(), (line, script)
    assert "gres" not in script and "gpu" not in script.replace("--partition=cpu", "").lower().replace("no gpu", "")
    assert "exclusive" not in script  # the evaluations' sbatch_flags are theirs


def test_the_watcher_falls_back_to_the_evaluations_partition_and_python():
    profile = make_profile(name="CL", partition="batch", remote_job_dir="/r", python="py3", watch_python=None)
    script = hosted.render_watcher_script(_hosted(profile))
    assert "#SBATCH --partition=batch" in script and "exec py3 -m ckpteval.watch.hosted" in script
    assert "#SBATCH --signal=B:USR1@300" in script and "#SBATCH --time=04:00:00" in script
    assert "--account" not in script


def test_the_cluster_env_is_the_same_profile_reached_locally(tmp_path: Path):
    text = hosted.cluster_env_toml(PROFILE, {"entity": "team", "project": None})
    path = tmp_path / "env.toml"
    path.write_text(text)
    assert tomllib.loads(text)["wandb"] == {"entity": "team"}
    there = load_env_file(path).profile("CL")
    assert there.part.tunnel == "local" and there.part.host is None and there.part.user is None
    expected = {**PROFILE.to_config(), "tunnel": "local", "host": None, "user": None}
    assert there.to_config() == expected


def test_plan_refuses_what_cannot_host_a_watcher(tmp_path: Path):
    with pytest.raises(ConfigError, match="Slurm cluster reached over SSH"):
        hosted.plan_hosted(_spec(_env(tmp_path, executor="local", tunnel="local")))
    with pytest.raises(ConfigError, match="no remote_job_dir"):
        hosted.plan_hosted(_spec(_env(tmp_path, host="h")))
    with pytest.raises(ConfigError, match="absolute path there"):
        hosted.plan_hosted(_spec(_env(tmp_path, host="h", remote_job_dir="/r"), save_dir="ckpts"))


def test_plan_takes_a_local_yaml_along_and_points_the_spec_at_the_files_there(tmp_path: Path):
    yaml = tmp_path / "mine.yaml"
    yaml.write_text("defaults: [tiny]\n")
    env = _env(tmp_path, host="h", remote_job_dir="/r", watch_time="00:30:00")
    spec = _spec(env, every=60)
    spec.configs = [str(yaml), "tiny"]
    h = hosted.plan_hosted(spec)
    assert h.home == f"/r/watch/{h.run}" and h.run == run_name("/lustre/run42/checkpoints", "CL")
    there = json.loads(h.uploads["spec.json"])
    assert there["configs"] == [f"{h.home}/config-0-mine.yaml", "tiny"]
    assert h.uploads["config-0-mine.yaml"] == "defaults: [tiny]\n"
    assert there["env_file"] == f"{h.home}/env.toml" and there["every"] == 60
    assert "#SBATCH --time=00:30:00" in h.uploads["watcher.sbatch"]


def test_cli_detach_dry_run_shows_the_script_and_bad_combinations_are_refused(tmp_path: Path):
    env = _env(tmp_path, host="h", remote_job_dir="/r", account="a")
    base = ["watch", "/lustre/run42/checkpoints", "-c", "tiny", "--run", "CL", "--env-file", str(env), "--detach"]
    shown = runner.invoke(app, [*base, "--dry-run"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "#SBATCH --signal=B:USR1@300" in shown.output and 'tunnel = "local"' in shown.output
    assert "nothing submitted" in shown.output
    once = runner.invoke(app, [*base, "--once"])
    assert once.exit_code == 2 and "--detach and --once" in once.output
    local = runner.invoke(app, ["watch", str(tmp_path), "-c", "tiny", "--detach"])
    assert local.exit_code == 2 and "reached over SSH" in local.output and "Traceback" not in local.output


@pytest.fixture
def link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """One link's home on a "cluster" (this machine): its spec, and a stand-in sbatch that logs its calls."""
    home = tmp_path / "home"
    home.mkdir()
    # the env.toml the watcher reads there: the profile reached `tunnel = "local"` (the next link's sbatch runs here)
    (home / "env.toml").write_text(hosted.cluster_env_toml(PROFILE, {}))
    spec = WatchSpec(
        save_dir=str(tmp_path / "ckpts"),
        configs=["tiny"],
        profile="CL",
        tasks=[],
        overrides=[],
        env_file=str(home / "env.toml"),
    )
    (home / "spec.json").write_text(json.dumps(spec.__dict__))
    (home / "watcher.sbatch").write_text("#!/bin/bash\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sbatch-calls"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/sh\necho "$@ $(env | grep -c ^SLURM_)" >> {calls}\necho 4242\n')
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CKPTEVAL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SLURM_JOB_ID", "4241")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    previous = signal.getsignal(signal.SIGUSR1)
    yield home, spec, calls
    signal.signal(signal.SIGUSR1, previous)


def _watch_until_stopped(spec: WatchSpec, **_kw: object) -> WatchOutcome:
    """The loop's stop check as the real watcher does it: the stop file, polled; Slurm's signal comes first."""
    run = run_name(spec.save_dir, spec.profile)
    started = time.time()
    os.kill(os.getpid(), signal.SIGUSR1)  # the time limit is near
    wait_until(stop_file(run).exists, timeout=60, what="the signal's stop file", interval=0.05)
    assert float(stop_file(run).read_text()) >= started
    return WatchOutcome(run, "stopped", [], [], [])


def test_on_the_signal_a_link_submits_the_next_and_ends_cleanly(link, monkeypatch):
    home, _, calls = link
    monkeypatch.setattr(watch_run, "watch", _watch_until_stopped)
    assert hosted.main([str(home)]) == 0
    (call,) = calls.read_text().splitlines()
    assert call == f"--parsable {home}/watcher.sbatch 0"  # the next link, without this allocation's SLURM_*
    assert (home / "links.log").read_text().split()[1:] == ["4242", "chained", "by", "4241"]


def test_after_a_stop_the_signal_submits_no_next_link(link, monkeypatch):
    home, _, calls = link
    (home / "stopped").write_text("1\n")
    monkeypatch.setattr(watch_run, "watch", _watch_until_stopped)
    assert hosted.main([str(home)]) == 0
    assert not calls.exists() and not (home / "links.log").exists()


def test_a_link_stopped_without_the_signal_submits_nothing(link, monkeypatch):
    home, spec, calls = link
    run = run_name(spec.save_dir, spec.profile)
    monkeypatch.setattr(watch_run, "watch", lambda s, **_kw: WatchOutcome(run, "stopped", [], [], []))
    assert hosted.main([str(home)]) == 0  # scancel (SIGTERM) or `watch stop`: the loop ended, no chain
    assert not calls.exists()


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A "cluster" on this machine: its files under tmp_path, squeue/scancel stand-ins over a jobs file
    (a running watcher ends when it gets SIGTERM), reached through LocalRemote instead of SSH."""
    from ckpteval.cluster import connect
    from ckpteval.cluster.remote import LocalRemote

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    jobs, calls = tmp_path / "jobs", tmp_path / "scancel-calls"
    jobs.write_text("")
    (bin_dir / "squeue").write_text(f"#!/bin/sh\ncat {jobs}\n")
    (bin_dir / "scancel").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        f'for id in "$@"; do case "$id" in -*) ;; *) grep -v "^$id|" {jobs} > {jobs}.new; mv {jobs}.new {jobs};; '
        "esac; done\n"
    )
    for tool in ("squeue", "scancel"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(connect, "connect_remote", lambda _profile, **_kw: LocalRemote())
    env = _env(tmp_path, host="h", remote_job_dir=str(tmp_path / "r"))
    h = hosted.plan_hosted(_spec(env))
    hosted.remember(h, str(env))
    ref = hosted.find_hosted(h.run[:6])
    assert ref is not None and ref.home == h.home
    return ref, jobs, calls


def test_status_reads_the_state_and_the_watcher_job_on_the_cluster(cluster):
    ref, jobs, _calls = cluster
    jobs.write_text("71|RUNNING|node3|None\n")
    state_dir = Path(ref.home, "state", "watch", ref.run)
    state_dir.mkdir(parents=True)
    spec = WatchSpec(save_dir=ref.save_dir, configs=["tiny"], profile="CL", tasks=[], overrides=[])
    from ckpteval.watch.state import WatchState, state_to_json

    (state_dir / "state.json").write_text(json.dumps(state_to_json(WatchState(ref.run, spec, 1.0, polls=7))))
    Path(ref.home, "links.log").write_text("1 70 submitted by the user\n2 71 chained by 70\n")
    status = hosted.hosted_status(ref)
    assert status.jobs == [ScriptJob("71", "RUNNING", "node3")]
    assert status.state is not None and status.state.polls == 7 and len(status.links) == 2
    shown = runner.invoke(app, ["watch", "status", ref.run], env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    assert "watching (Slurm job 71 RUNNING on node3)" in shown.output and "2 link(s)" in shown.output
    listed = runner.invoke(app, ["watch", "status"])
    assert f"on a cluster (--detach; `evaluate watch status RUN` asks it): {ref.run}" in listed.output


def test_stop_marks_the_run_stopped_terms_the_running_link_and_cancels_a_queued_one(cluster):
    ref, jobs, calls = cluster
    jobs.write_text("71|RUNNING|node3|None\n72|PENDING||Dependency\n")
    result = runner.invoke(app, ["watch", "stop", ref.run, "--timeout", "5"])
    assert result.exit_code == 0 and "stopped the watcher" in result.output, result.output
    assert calls.read_text().splitlines() == ["72", "--batch --signal=TERM 71"]
    assert Path(ref.home, "stopped").is_file()  # a link signalled now submits no next one
    assert Path(ref.home, "state", "watch", ref.run, "stop").is_file()


def test_stop_says_so_when_the_watcher_does_not_end(cluster, monkeypatch):
    ref, jobs, calls = cluster
    jobs.write_text("71|RUNNING|node3|None\n")
    (Path(calls.parent, "bin", "scancel")).write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')  # ignored by it
    message, stopped = hosted.stop_hosted(ref, timeout=1)
    assert not stopped and "did not end within 1 s: cancelled" in message
    assert calls.read_text().splitlines()[-1] == f"--name {hosted.job_name(ref.run)}"


def test_a_cluster_python_without_this_ckpteval_is_named_in_one_message(tmp_path: Path):
    from importlib.metadata import version

    import ckpteval
    from ckpteval.cluster.remote import LocalRemote

    assert ckpteval.__version__ == version("ckpteval")  # what `--version` prints is what the check compares

    other = tmp_path / "other-python"
    other.write_text("#!/bin/sh\nprintf 0.0.1\n")
    other.chmod(0o755)
    remote = LocalRemote()
    assert hosted.python_problem(remote, sys.executable) is None
    assert hosted.python_problem(remote, str(other)) == f"it has ckpteval 0.0.1, this machine {ckpteval.__version__}"
    missing = hosted.python_problem(remote, "/usr/bin/false")
    assert missing is not None and missing.startswith("it cannot import ckpteval")


def test_stop_cancel_of_a_watcher_on_the_cluster_is_refused_before_anything_is_stopped(cluster):
    import ckpteval
    from ckpteval.errors import ConfigError

    ref, jobs, calls = cluster
    jobs.write_text("71|RUNNING|node3|None\n")
    with pytest.raises(ConfigError, match="lives on the cluster: stopping it with --cancel is not supported"):
        ckpteval.watch_stop(ref.run, timeout=1, cancel=True)
    assert not calls.exists() and jobs.read_text() == "71|RUNNING|node3|None\n"  # nothing was cancelled


def test_an_executor_that_hosts_no_watchers_is_refused_before_anything_is_contacted(tmp_path: Path):
    """The registry's `hosts_watchers` decides, not the executor's name: this machine's backend hosts none."""
    from ckpteval.execution.backends import script_host

    profile = load_env_file(_env(tmp_path, executor="local")).profile("CL")
    with pytest.raises(ConfigError) as err:
        script_host(profile)
    assert err.value.message == "Profile [CL]: executor 'local' cannot host a watcher (--detach)."
