"""Resolving a profile's host through ~/.ssh/config, and the host-trust hint (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpteval.cluster.ssh import SSHRemote
from ckpteval.cluster.ssh_hosts import resolve_target, trust_command
from ckpteval.config.profiles import make_profile
from ckpteval.errors import ClusterError

CONFIG = """
Host login
    HostName login01.cluster.example
    User alice
    Port 2200
    IdentityFile ~/.ssh/id_cluster
    IdentitiesOnly yes
    ProxyJump bob@bastion.example:2022,jumpalias

Host jumpalias
    HostName jump.internal
    User carol

Host plain
    HostName 10.0.0.5
    UserKnownHostsFile ~/.ssh/known_hosts_cluster /etc/other_known

Host viacmd
    HostName 10.0.0.6
    ProxyCommand ssh -W %h:%p gateway
"""


@pytest.fixture
def ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "config"
    path.write_text(CONFIG)
    return path


def test_alias_with_proxyjump_chain(ssh_config, tmp_path):
    t = resolve_target("login", ssh_config=ssh_config)
    assert (t.hostname, t.port, t.user) == ("login01.cluster.example", 2200, "alice")
    assert t.identities == (str(tmp_path / ".ssh/id_cluster"),) and t.identities_only
    assert [(j.hostname, j.port, j.user) for j in t.proxy_jump] == [
        ("bastion.example", 2022, "bob"),
        ("jump.internal", 22, "carol"),
    ]
    assert t.address == "alice@login01.cluster.example:2200"
    assert t.known_hosts_name == "[login01.cluster.example]:2200"


def test_profile_values_win_over_the_config(ssh_config, tmp_path):
    t = resolve_target("login", user="dave", port=22, identity="~/.ssh/mine", ssh_config=ssh_config)
    assert (t.user, t.port) == ("dave", 22)
    assert t.identities[0] == str(tmp_path / ".ssh/mine")  # the profile's key is tried first
    assert t.known_hosts_name == "login01.cluster.example"


def test_unknown_names_pass_through_and_known_hosts_files_are_read_from_config(ssh_config, tmp_path):
    t = resolve_target("some.host", user="u", ssh_config=ssh_config)
    assert (t.hostname, t.port, t.proxy_jump, t.proxy_command) == ("some.host", 22, (), None)
    plain = resolve_target("plain", user="u", ssh_config=ssh_config)
    assert plain.known_hosts == (str(tmp_path / ".ssh/known_hosts_cluster"), "/etc/other_known")
    assert trust_command(plain) == f"ssh-keyscan 10.0.0.5 >> {tmp_path}/.ssh/known_hosts_cluster"
    assert resolve_target("viacmd", user="u", ssh_config=ssh_config).proxy_command == "ssh -W 10.0.0.6:22 gateway"


def test_trust_command_names_the_port_and_default_file(ssh_config):
    t = resolve_target("x.example", user="u", port=2222, ssh_config=ssh_config)
    assert trust_command(t) == "ssh-keyscan -p 2222 x.example >> ~/.ssh/known_hosts"


def test_missing_host_or_key_file_is_a_clear_error(tmp_path):
    with pytest.raises(ClusterError, match="no `host`"):
        SSHRemote.connect(make_profile(name="C", host=None))
    with pytest.raises(ClusterError, match=r"identity file .* does not exist"):
        SSHRemote.connect(make_profile(name="C", host="h", identity=str(tmp_path / "nope")))
