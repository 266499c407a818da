"""A profile's keys are its executor's: the neutral `Profile` holds the executor's typed part (`Profile.part`),
env.toml stays flat as users write it, and a key of another executor is refused naming that executor."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.config.executors import LocalProfile, SlurmProfile, SshProfile, find_executor
from ckpteval.config.profiles import NEUTRAL_KEYS, Profile, load_env_file, make_profile
from ckpteval.errors import ConfigError

runner = CliRunner()

ENV = """
[CL]
executor = "slurm"
host = "login.example"
partition = "batch"
remote_job_dir = "/lustre/me/ckpteval"
watch_partition = "cpu"

[WS]
executor = "ssh"
host = "gpu-box.example"
remote_job_dir = "/data/me/ckpteval"
python = "/data/me/venv/bin/python"
gpus_per_node = 4
compute_internet = false
"""


def test_each_executor_types_its_own_keys(write_env):
    write_env(ENV)
    env = load_env_file()
    cluster, box, here = env.profile("CL"), env.profile("WS"), env.profile(None)
    assert isinstance(cluster.part, SlurmProfile) and cluster.part.watch_partition == "cpu"
    assert isinstance(box.part, SshProfile) and box.part.gpus_per_node == 4
    assert isinstance(here.part, LocalProfile)
    # the neutral layers ask the part, never read its fields
    assert box.part.files_dir() == "/data/me/ckpteval" and box.part.data_offline()
    assert box.part.step_python() == "/data/me/venv/bin/python" and box.part.step_image() is None
    assert here.part.files_here() and here.part.files_dir() is None
    # the composed config's run.env is flat, as env.toml spells the keys
    assert box.to_config()["gpus_per_node"] == 4 and box.to_config()["executor"] == "ssh"
    assert "partition" not in box.to_config()


def test_the_neutral_profile_holds_no_executors_field():
    assert {f.name for f in dataclasses.fields(Profile)} == {"name", "part", *NEUTRAL_KEYS}
    for executor in ("local", "slurm", "ssh"):
        own = {f.name for f in dataclasses.fields(find_executor(executor).profile)}
        assert not own & {*NEUTRAL_KEYS, "name"}


@pytest.mark.parametrize(
    ("executor", "keys", "message", "hint"),
    [
        (
            "ssh",
            {"partition": "batch"},
            "'partition' is a key of 'slurm' profiles, and this profile's executor is 'ssh'",
            "executor = 'slurm'",
        ),
        ("ssh", {"hots": "h"}, "unknown key 'hots'. Did you mean 'host'?", "remote_job_dir"),
        (
            "local",
            {"host": "h"},
            "'host' is a key of 'slurm' and 'ssh' profiles",
            "Keys of a profile with executor = 'local': executor, extends, judge, tunnel.",
        ),
        ("slurm", {"judg": "x"}, "unknown key 'judg'. Did you mean 'judge'?", "sbatch_flags"),
        ("ssh", {"gpus_per_node": -1}, "'gpus_per_node' must be at least 0", None),
        ("ssh", {"port": 70000}, "'port' must be between 1 and 65535", None),
    ],
)
def test_a_key_the_executor_does_not_have_is_refused_with_what_to_do(executor, keys, message, hint):
    with pytest.raises(ConfigError) as err:
        make_profile("P", executor, where="env.toml [P]", **keys)
    assert err.value.message.startswith("env.toml [P]: ") and message in err.value.message
    if hint:
        assert hint in (err.value.hint or "")


def test_squash_on_an_ssh_profile_is_refused_in_one_line(write_env):
    path = write_env(ENV)
    done = runner.invoke(app, ["squash", "nvcr.io/nvidia/nemo:25.09", "--run", "WS", "--env-file", str(path)])
    assert done.exit_code != 0
    assert "nothing to squash" in " ".join(done.output.split()) and "Traceback" not in done.output


def test_data_is_staged_under_the_ssh_machines_remote_job_dir(write_env):
    from ckpteval.cluster.data_push import datasets_dir

    write_env(ENV)
    assert datasets_dir(load_env_file().profile("WS")) == "/data/me/ckpteval/datasets"
    with pytest.raises(ConfigError, match="runs its jobs on this machine"):
        datasets_dir(load_env_file().profile(None))
