from __future__ import annotations

from pathlib import Path

import pytest

from ckpteval.config.profiles import LOCAL_PROFILE, find_env_file, load_env_file
from ckpteval.errors import ConfigError

CLUSTER = """
[wandb]
entity = "team"
project = "evals"

[base]
host = "login.example.com"
account = "acct"
remote_job_dir = "/lustre/me"
env_vars = { A = "1", B = "2" }

[debug]
extends = "base"
partition = "interactive"
env_vars = { B = "two" }
"""


def test_extends_inherits_and_overrides(write_env):
    write_env(CLUSTER)
    env = load_env_file()
    debug = env.profile("debug")
    assert debug.part.host == "login.example.com"
    assert debug.part.partition == "interactive"
    assert debug.part.env_vars == {"A": "1", "B": "two"}  # tables merge key by key
    assert debug.extends is None
    assert env.wandb.project == "evals"


def test_no_env_file_gives_only_local_profile():
    env = load_env_file()
    assert env.path is None
    assert env.profile(None).executor == "local"
    assert env.profile(LOCAL_PROFILE).name == "local"


def test_lookup_order(tmp_path: Path, monkeypatch, isolated_user: Path):
    walked = isolated_user / "env.toml"
    walked.write_text("[a]\nhost='walked'\n")
    sub = isolated_user / "deep" / "er"
    sub.mkdir(parents=True)
    assert find_env_file(cwd=sub) == walked.resolve()
    via_var = tmp_path / "var.toml"
    via_var.write_text("[a]\nhost='var'\n")
    monkeypatch.setenv("CKPTEVAL_ENV_FILE", str(via_var))
    assert find_env_file(cwd=sub) == via_var
    explicit = tmp_path / "explicit.toml"
    explicit.write_text("")
    assert find_env_file(explicit, cwd=sub) == explicit


def test_user_config_dir_is_last_resort(isolated_user: Path):
    import os

    cfg = Path(os.environ["XDG_CONFIG_HOME"]) / "ckpteval"
    cfg.mkdir(parents=True)
    (cfg / "env.toml").write_text("[u]\nhost='user'\n")
    assert load_env_file().profile("u").part.host == "user"


@pytest.mark.parametrize(
    ("text", "profile", "message"),
    [
        ("[a\nhost='x'", "a", "not valid TOML"),
        ("[a]\nhost='x'", "b", "Unknown profile 'b'"),
        ("[a]\nextends='b'\n[b]\nextends='a'", "a", "cycle: a -> b -> a"),
        ("[a]\nextends='nope'", "a", "extends 'nope', which does not exist"),
        ("[a]\nhots='x'", "a", "unknown key 'hots'. Did you mean 'host'"),
        ("[a]\nnodes='two'", "a", "'nodes' must be an integer"),
        ("[a]\nexecutor='k8s'", "a", "'executor' is 'k8s'; it must be one of 'local', 'slurm'"),
        ("stray = 1", "a", "top-level key 'stray' is not a [profile] table"),
    ],
)
def test_bad_env_files(write_env, text, profile, message):
    write_env(text)
    with pytest.raises(ConfigError) as err:
        load_env_file().profile(profile)
    assert message in str(err.value)


def test_unknown_profile_lists_existing(write_env):
    write_env(CLUSTER)
    with pytest.raises(ConfigError) as err:
        load_env_file().profile("debgu")
    assert "Did you mean 'debug'" in err.value.message
    assert "base, debug, local" in (err.value.hint or "")
