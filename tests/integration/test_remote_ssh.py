"""The Remote seam over a real sshd: quoting, one reused connection, files, keys, host keys, ProxyJump."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import paramiko
import pytest

from ckpteval.cluster.connect import connect_remote
from ckpteval.cluster.ssh import SSHRemote
from ckpteval.errors import ClusterError
from tests.integration.conftest import Infra, trust_infra_host

NASTY = ["a b", "it's", 'say "hi"', "$(touch {canary})", "`touch {canary}`", "x; touch {canary}", "*", "\\n", ""]


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    path = Path(f"/tmp/ckpteval-canary-{uuid.uuid4().hex[:8]}")
    yield path
    path.unlink(missing_ok=True)


def test_arguments_reach_the_remote_command_verbatim_and_nothing_is_executed(ci_profile, canary):
    words = [w.format(canary=canary) for w in NASTY]
    with connect_remote(ci_profile()) as remote:
        result = remote.run(["printf", "%s\\n", *words])
    assert result.stdout.split("\n")[:-1] == words
    assert not canary.exists()


def test_one_connection_serves_every_command(ci_profile, infra: Infra):
    with connect_remote(ci_profile()) as remote:
        assert isinstance(remote, SSHRemote)
        local_port = remote._client.get_transport().sock.getsockname()[1]
        seen = {remote.run("echo $SSH_CONNECTION").stdout.split()[1] for _ in range(5)}
        remote.exists("/etc/hostname")
        remote.read_text("/etc/hostname")
        seen.add(remote.run("echo $SSH_CONNECTION").stdout.split()[1])
    # sshd saw one client port: every command and SFTP call used the same TCP connection
    assert seen == {str(local_port)}


def test_failures_timeouts_and_stdin(ci_profile):
    with connect_remote(ci_profile()) as remote:
        assert remote.run(["cat"], stdin="from stdin\n").stdout == "from stdin\n"
        failed = remote.run(["ls", "/no/such/dir"], check=False)
        assert failed.returncode != 0 and "No such file" in failed.stderr
        with pytest.raises(ClusterError, match=r"(?s)exit 2.*No such file"):
            remote.run(["ls", "/no/such/dir"])
        with pytest.raises(ClusterError, match="timed out after 1 s"):
            remote.run(["sleep", "30"], timeout=1)
        # the connection is still usable after a timeout
        assert remote.run(["echo", "ok"]).stdout == "ok\n"


def test_stream_delivers_lines_as_they_come(ci_profile):
    seen: list[tuple[str, str]] = []
    with connect_remote(ci_profile()) as remote:
        result = remote.stream(
            "echo one; echo two >&2; sleep 1; echo three", on_line=lambda s, line: seen.append((s, line))
        )
    assert result.returncode == 0
    assert seen == [("stdout", "one"), ("stderr", "two"), ("stdout", "three")]


def test_files_are_written_atomically_and_read_back(ci_profile, remote_job_dir, tmp_path):
    local = tmp_path / "in.txt"
    local.write_text("payload\n")
    with connect_remote(ci_profile()) as remote:
        remote.write_text_atomic(f"{remote_job_dir}/sub dir/a.txt", "héllo\n", mode=0o600)
        assert remote.read_text(f"{remote_job_dir}/sub dir/a.txt") == "héllo\n"
        remote.put(local, f"{remote_job_dir}/b.txt")
        remote.get(f"{remote_job_dir}/b.txt", tmp_path / "out" / "b.txt")
        assert remote.exists(f"{remote_job_dir}/b.txt")
        assert not remote.exists(f"{remote_job_dir}/nope")
        with pytest.raises(ClusterError, match="Cannot read"):
            remote.read_text(f"{remote_job_dir}/nope")
    assert (tmp_path / "out" / "b.txt").read_text() == "payload\n"
    assert sorted(os.listdir(f"{remote_job_dir}/sub dir")) == ["a.txt"]  # no temporary file left
    assert oct(os.stat(f"{remote_job_dir}/sub dir/a.txt").st_mode & 0o777) == "0o600"
    assert os.stat(f"{remote_job_dir}/b.txt").st_uid == pwd_uid("ciuser")


def pwd_uid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_uid


def test_ssh_config_alias_and_proxyjump(ssh_home, infra: Infra, ci_profile):
    shutil.copy(infra.ssh_config, ssh_home / ".ssh" / "config")
    trust_infra_host(ssh_home, infra)
    # the profile names only the alias: host name, port, user and key come from ~/.ssh/config
    with connect_remote(ci_profile(host=infra.ssh_alias, port=None, user=None, identity=None)) as remote:
        assert remote.run(["whoami"]).stdout.strip() == infra.ssh_user
    with connect_remote(ci_profile(host=infra.ssh_alias_proxyjump, port=None, user=None, identity=None)) as remote:
        assert isinstance(remote, SSHRemote)
        bastion, login = remote._clients
        bastion_port = bastion.get_transport().sock.getsockname()[1]
        # the login node's session arrives over a channel of the bastion connection, not a socket
        assert isinstance(login.get_transport().sock, paramiko.Channel)
        from_login = remote.run("echo $SSH_CONNECTION").stdout.split()
        _, stdout, _ = bastion.exec_command("echo $SSH_CONNECTION")
        from_bastion = stdout.read().decode().split()
    assert from_bastion[1] == str(bastion_port)  # we reached the bastion directly
    assert from_login[1] != str(bastion_port)  # the login node was reached from the bastion's forward


def test_ssh_agent_key_is_used(ssh_home, infra: Infra, ci_profile, tmp_path):
    trust_infra_host(ssh_home, infra)
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if sock.exists():
                break
            time.sleep(0.1)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", infra.ssh_key], env=env, check=True)
        os.environ["SSH_AUTH_SOCK"] = str(sock)  # ssh_home's monkeypatch restores it
        with connect_remote(ci_profile(identity=None)) as remote:
            assert remote.run(["whoami"]).stdout.strip() == infra.ssh_user
    finally:
        agent.terminate()
        agent.wait()


def test_authentication_failure_is_one_clear_error(ssh_home, infra: Infra, ci_profile):
    trust_infra_host(ssh_home, infra)
    stranger = ssh_home / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    with pytest.raises(ClusterError) as err:
        connect_remote(ci_profile(identity=str(stranger)))
    assert f"SSH authentication failed for {infra.ssh_user}@{infra.ssh_host}:{infra.ssh_port}" in err.value.message
    assert str(stranger) in err.value.message
    assert "authorized_keys" in err.value.hint


def test_passphrase_protected_key_asks_for_the_agent(ssh_home, infra: Infra, ci_profile):
    trust_infra_host(ssh_home, infra)
    locked = ssh_home / "locked_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(locked)], check=True)
    with pytest.raises(ClusterError, match="passphrase-protected") as err:
        connect_remote(ci_profile(identity=str(locked)))
    assert "ssh-add" in err.value.hint


def test_unknown_host_is_refused_with_the_command_that_trusts_it(ssh_home, infra: Infra, ci_profile):
    profile = ci_profile()
    with pytest.raises(ClusterError) as err:
        connect_remote(profile)
    assert f"[{infra.ssh_host}]:{infra.ssh_port} is not known" in err.value.message
    command = f"ssh-keyscan -p {infra.ssh_port} {infra.ssh_host} >> ~/.ssh/known_hosts"
    assert command in err.value.hint
    # what the hint says works
    subprocess.run(["bash", "-c", command], check=True, capture_output=True, env={**os.environ, "HOME": str(ssh_home)})
    with connect_remote(profile) as remote:
        assert remote.run(["true"]).ok


def test_accept_new_adds_the_host_to_known_hosts(ssh_home, infra: Infra, ci_profile):
    known = ssh_home / ".ssh" / "known_hosts"
    assert not known.exists()
    with connect_remote(ci_profile(host_key_policy="accept-new")) as remote:
        assert remote.run(["true"]).ok
    host_key = Path(infra.ssh_known_hosts).read_text().split("\n")[0].split(" ", 1)[1]
    assert known.read_text() == f"[{infra.ssh_host}]:{infra.ssh_port} {host_key}\n"
    assert oct(known.stat().st_mode & 0o777) == "0o600"
    with connect_remote(ci_profile()) as remote:  # now known: strict works
        assert remote.run(["true"]).ok


def test_changed_host_key_is_refused_even_with_accept_new(ssh_home, infra: Infra, ci_profile):
    other = paramiko.Ed25519Key.from_private_key_file(infra.ssh_key)  # any other ed25519 key
    (ssh_home / ".ssh" / "known_hosts").write_text(
        f"[{infra.ssh_host}]:{infra.ssh_port} ssh-ed25519 {other.get_base64()}\n"
    )
    with pytest.raises(ClusterError, match="has CHANGED") as err:
        connect_remote(ci_profile(host_key_policy="accept-new"))
    assert "ssh-keygen -R" in err.value.hint


def test_unreachable_host_and_wrong_port(infra: Infra, ci_profile):
    import socket

    free = _free_port()
    with pytest.raises(ClusterError, match=f"Cannot reach {infra.ssh_host}:{free}"):
        connect_remote(ci_profile(port=free))
    with pytest.raises(ClusterError, match=r"Cannot resolve host 'no-such-host\.invalid'"):
        connect_remote(ci_profile(host="no-such-host.invalid"))
    # a listener that accepts the connection and never speaks SSH: a clear message, no hang
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(ClusterError, match=f"No SSH server answered at .*:{port} .*within 2 s"):
            connect_remote(ci_profile(port=port), connect_timeout=2)
        assert time.monotonic() - start < 10


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_proxycommand_from_ssh_config(ssh_home, infra: Infra, ci_profile):
    trust_infra_host(ssh_home, infra)
    (ssh_home / ".ssh" / "config").write_text(
        "Host via-command\n"
        f"    HostName {infra.ssh_host}\n    Port {infra.ssh_port}\n    User {infra.ssh_user}\n"
        f"    IdentityFile {infra.ssh_key}\n"
        f"    ProxyCommand ssh -F none -i {infra.ssh_key} -o BatchMode=yes"
        f" -o UserKnownHostsFile={infra.ssh_known_hosts}"
        f" -p {infra.ssh_port} {infra.ssh_user}@{infra.ssh_host} -W %h:%p\n"
    )
    with connect_remote(ci_profile(host="via-command", port=None, user=None, identity=None)) as remote:
        assert isinstance(remote._client.get_transport().sock, paramiko.ProxyCommand)
        assert remote.run(["whoami"]).stdout.strip() == infra.ssh_user
