"""Where an SSH connection goes and which host keys it trusts, resolved like the `ssh` command would.

- host, user, port and key come from the profile, falling back to `~/.ssh/config` (a Host alias,
  its HostName/User/Port/IdentityFile/IdentitiesOnly/UserKnownHostsFile, and `ProxyJump` through
  one or more bastions, or `ProxyCommand`);
- host keys are checked against known_hosts (~/.ssh/known_hosts or the config's
  UserKnownHostsFile, and /etc/ssh/ssh_known_hosts). An unknown host is refused with the command
  that trusts it, unless the profile says `host_key_policy = "accept-new"` (then its key is
  added to known_hosts, as `ssh -o StrictHostKeyChecking=accept-new` does). A changed key is
  always refused.

The connection itself is `ckpteval.cluster.ssh.SSHRemote`.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from ckpteval.errors import ClusterError

log = logging.getLogger("ckpteval.remote")

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"


@dataclass(frozen=True)
class SSHTarget:
    """One SSH endpoint, fully resolved (profile values over ~/.ssh/config over defaults)."""

    name: str  # what the user wrote (an alias or a hostname)
    hostname: str
    port: int
    user: str
    identities: tuple[str, ...] = ()
    identities_only: bool = False
    known_hosts: tuple[str, ...] = (DEFAULT_KNOWN_HOSTS,)
    proxy_jump: tuple[SSHTarget, ...] = ()
    proxy_command: str | None = None

    @property
    def address(self) -> str:
        """`user@host:port` for messages."""
        return f"{self.user}@{self.hostname}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """The name this host's key is stored under in known_hosts (OpenSSH's convention)."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def ssh_config_path() -> Path:
    """The user's OpenSSH client config (`~/.ssh/config`)."""
    return Path(os.path.expanduser("~/.ssh/config"))


def _load_ssh_config(path: Path | None) -> paramiko.SSHConfig:
    path = path or ssh_config_path()
    if not path.is_file():
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except (OSError, paramiko.ssh_exception.ConfigParseError) as exc:
        raise ClusterError(f"Cannot read the SSH config {path}: {exc}.", hint="Fix the file or move it away.") from None


def resolve_target(
    host: str,
    *,
    user: str | None = None,
    port: int | None = None,
    identity: str | None = None,
    ssh_config: Path | None = None,
) -> SSHTarget:
    """Resolve `host` (a hostname or a ~/.ssh/config alias) into everything needed to connect."""
    config = _load_ssh_config(ssh_config)
    return _resolve(config, host, user=user, port=port, identity=identity, with_jumps=True)


def _resolve(
    config: paramiko.SSHConfig,
    host: str,
    *,
    user: str | None,
    port: int | None,
    identity: str | None,
    with_jumps: bool,
) -> SSHTarget:
    entry: dict[str, Any] = dict(config.lookup(host))
    identities: list[str] = []
    if identity:
        identities.append(os.path.expanduser(identity))
    identities += [os.path.expanduser(p) for p in entry.get("identityfile", [])]
    known = entry.get("userknownhostsfile")
    known_hosts = tuple(os.path.expanduser(p) for p in known.split()) if known else (DEFAULT_KNOWN_HOSTS,)
    jumps: tuple[SSHTarget, ...] = ()
    jump_spec = entry.get("proxyjump")
    if with_jumps and jump_spec and jump_spec.lower() != "none":
        jumps = tuple(_resolve_jump(config, hop) for hop in jump_spec.split(","))
    proxy_command = entry.get("proxycommand")
    if proxy_command and proxy_command.lower() == "none":
        proxy_command = None
    try:
        resolved_port = int(port or entry.get("port") or 22)
    except ValueError:
        raise ClusterError(f"~/.ssh/config: Port for '{host}' is not a number: {entry.get('port')!r}.") from None
    return SSHTarget(
        name=host,
        hostname=entry.get("hostname", host),
        port=resolved_port,
        user=user or entry.get("user") or getpass.getuser(),
        identities=tuple(dict.fromkeys(identities)),
        identities_only=str(entry.get("identitiesonly", "no")).lower() == "yes",
        known_hosts=known_hosts,
        proxy_jump=jumps,
        proxy_command=None if jumps else proxy_command,  # OpenSSH: ProxyJump wins over ProxyCommand
    )


def _resolve_jump(config: paramiko.SSHConfig, spec: str) -> SSHTarget:
    # [user@]host[:port], where host may itself be an alias
    spec = spec.strip().removeprefix("ssh://")
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    if rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
        port = int(port_text) if port_text.isdigit() else None
    return _resolve(config, host, user=user or None, port=port, identity=None, with_jumps=False)


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a host key, e.g. `SHA256:ab12...`."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def trust_command(target: SSHTarget) -> str:
    """The shell command that adds `target`'s host key to the user's known_hosts."""
    port = [] if target.port == 22 else ["-p", str(target.port)]
    known = target.known_hosts[0]
    shown = known if known.startswith("~") else shlex.quote(known)
    return f"{shlex.join(['ssh-keyscan', *port, target.hostname])} >> {shown}"


class UnknownHostKey(Exception):
    """Raised from inside paramiko's handshake; turned into a ClusterError once it is closed."""

    def __init__(self, key: paramiko.PKey) -> None:
        super().__init__("unknown host key")
        self.key = key


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    def __init__(self, target: SSHTarget, accept_new: bool) -> None:
        self._target = target
        self._accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self._accept_new:
            raise UnknownHostKey(key)
        path = Path(os.path.expanduser(self._target.known_hosts[0]))
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"  # the format ssh-keyscan writes
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(line)
        except OSError as exc:
            raise ClusterError(f"Cannot add the host key of {hostname} to {path}: {exc.strerror}.") from None
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning("Permanently added %s (%s %s) to %s.", hostname, key.get_name(), fingerprint(key), path)
