"""`SSHRemote`: the Remote seam over one paramiko connection, reused for a whole invocation.

Where it connects and which host keys it trusts is `ckpteval.cluster.ssh_hosts` (profile over
~/.ssh/config, ProxyJump/ProxyCommand, known_hosts); keys: the profile's `identity`, the config's
IdentityFile, the ssh-agent, then ~/.ssh/id_*.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shlex
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import paramiko

from ckpteval.cluster.remote import (
    ConnectionLost,
    LineBuffer,
    LineCallback,
    RunResult,
    check_result,
    command_line,
    shorten,
)
from ckpteval.cluster.ssh_hosts import (
    SYSTEM_KNOWN_HOSTS,
    HostKeyPolicy,
    SSHTarget,
    UnknownHostKey,
    fingerprint,
    resolve_target,
    trust_command,
)
from ckpteval.errors import ClusterError

if TYPE_CHECKING:
    from ckpteval.config.profiles import Profile

log = logging.getLogger("ckpteval.remote")
# paramiko logs a failed handshake with a traceback from its transport thread; without a handler
# Python would print it to stderr. Our ClusterError says what went wrong; -v logging still sees it.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
EOF_GRACE_S = 5.0


def _open_socket(target: SSHTarget, timeout: float) -> Any:
    if target.proxy_command:
        return paramiko.ProxyCommand(target.proxy_command)
    try:
        return socket.create_connection((target.hostname, target.port), timeout=timeout)
    except socket.gaierror:
        raise ClusterError(
            f"Cannot resolve host '{target.hostname}'"
            + (f" (from '{target.name}')" if target.name != target.hostname else "")
            + ".",
            hint="Check `host` in the env.toml profile (a hostname or a Host alias in ~/.ssh/config).",
        ) from None
    except TimeoutError:
        raise ClusterError(
            f"Cannot reach {target.hostname}:{target.port}: no answer within {timeout:g} s.",
            hint="Check the host and port, your network/VPN, and whether a bastion (ProxyJump in ~/.ssh/config) "
            "is needed.",
        ) from None
    except OSError as exc:
        raise ClusterError(
            f"Cannot reach {target.hostname}:{target.port}: {exc.strerror or exc}.",
            hint="Check the host and port in the profile, and that sshd is running there.",
        ) from None


def _connect_hop(
    target: SSHTarget, sock: Any, *, accept_new: bool, timeout: float, via: str | None
) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    for path in (*target.known_hosts, SYSTEM_KNOWN_HOSTS):
        expanded = os.path.expanduser(path)
        if os.path.isfile(expanded):
            try:
                client.load_system_host_keys(expanded)
            except (OSError, paramiko.SSHException) as exc:
                raise ClusterError(f"Cannot read known_hosts file {expanded}: {exc}.") from None
    client.set_missing_host_key_policy(HostKeyPolicy(target, accept_new))
    where = target.address + (f" (via {via})" if via else "")
    keys = [k for k in target.identities if os.path.isfile(k)]
    try:
        client.connect(
            hostname=target.hostname,
            port=target.port,
            username=target.user,
            key_filename=keys or None,  # type: ignore[arg-type]  # paramiko takes a list of files too
            allow_agent=not target.identities_only or not keys,
            look_for_keys=not keys,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            sock=sock,
        )
    except UnknownHostKey as exc:
        client.close()
        raise ClusterError(
            f"The host key of {target.known_hosts_name} is not known ({exc.key.get_name()} {fingerprint(exc.key)}).",
            hint="If that fingerprint is the server's, trust it with:\n  "
            + trust_command(target)
            + '\nor set host_key_policy = "accept-new" in the env.toml profile to add unknown hosts automatically.',
        ) from None
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise ClusterError(
            f"The host key of {target.known_hosts_name} has CHANGED ({fingerprint(exc.key)}; "
            f"known_hosts has {fingerprint(exc.expected_key)}). Someone may be intercepting the connection.",
            hint="If the server's key really changed, remove the old one with "
            f"`ssh-keygen -R {shlex.quote(target.known_hosts_name)}` and trust the new one.",
        ) from None
    except paramiko.PasswordRequiredException:
        client.close()
        raise ClusterError(
            f"SSH key for {where} is passphrase-protected.",
            hint="Load it into the agent (`ssh-add KEYFILE`) so it can be used without a prompt.",
        ) from None
    except paramiko.AuthenticationException:
        client.close()
        tried = ", ".join(keys) if keys else "ssh-agent and ~/.ssh/id_*"
        raise ClusterError(
            f"SSH authentication failed for {where} (tried: {tried}).",
            hint="Set `identity` (a private key file) or `user` in the env.toml profile, or load the key with "
            "`ssh-add`; its public key must be in ~/.ssh/authorized_keys on the cluster.",
        ) from None
    except TimeoutError:
        client.close()
        raise ClusterError(
            f"SSH handshake with {where} timed out after {timeout:g} s.",
            hint="Check that the host and port belong to an SSH server.",
        ) from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        transport = client.get_transport()
        spoke_ssh = transport is not None and bool(transport.remote_version)
        client.close()
        if not spoke_ssh:
            raise ClusterError(
                f"No SSH server answered at {where} (no SSH banner within {timeout:g} s).",
                hint="Check the host and port in the profile; a firewall or proxy may be in the way.",
            ) from None
        raise ClusterError(
            f"SSH connection to {where} failed: {exc}.",
            hint="Check the host and port in the profile (is it an SSH server?), or try `ssh` by hand.",
        ) from None
    transport = client.get_transport()
    assert transport is not None
    transport.set_keepalive(30)  # long imports: keep NATs and firewalls from dropping an idle link
    return client


@dataclass
class SSHRemote:
    """Commands and files on a login node, over one SSH connection (plus one per bastion hop)."""

    target: SSHTarget
    _clients: list[paramiko.SSHClient]
    _sftp: paramiko.SFTPClient | None = field(default=None, repr=False)

    @classmethod
    def connect(cls, profile: Profile, *, connect_timeout: float = 20.0, ssh_config: Path | None = None) -> SSHRemote:
        """Open the connection for an SSH profile (`host` is required)."""
        from ckpteval.config.executors import remote_part

        reach = remote_part(profile)
        if not reach.host:
            raise ClusterError(
                f'Profile [{profile.name}] has tunnel = "ssh" but no `host`.',
                hint='Set host = "login.example.com" (or a ~/.ssh/config alias) in env.toml, '
                'or tunnel = "local" when running on the login node.',
            )
        if reach.identity and not os.path.isfile(os.path.expanduser(reach.identity)):
            raise ClusterError(
                f"Profile [{profile.name}]: identity file {reach.identity} does not exist.",
                hint="Point `identity` at your private key, or remove it to use ~/.ssh/config and the ssh-agent.",
            )
        target = resolve_target(
            reach.host, user=reach.user, port=reach.port, identity=reach.identity, ssh_config=ssh_config
        )
        return cls.open(target, accept_new=reach.host_key_policy == "accept-new", connect_timeout=connect_timeout)

    @classmethod
    def open(cls, target: SSHTarget, *, accept_new: bool = False, connect_timeout: float = 20.0) -> SSHRemote:
        """Connect to a resolved target, through its ProxyJump hops if any."""
        hops = [*target.proxy_jump, target]
        clients: list[paramiko.SSHClient] = []
        log.debug("ssh connect %s%s", target.address, "".join(f" via {h.address}" for h in target.proxy_jump))
        try:
            sock = _open_socket(hops[0], connect_timeout)
            for i, hop in enumerate(hops):
                via = hops[i - 1].address if i else None
                clients.append(_connect_hop(hop, sock, accept_new=accept_new, timeout=connect_timeout, via=via))
                if i + 1 < len(hops):
                    nxt = hops[i + 1]
                    transport = clients[-1].get_transport()
                    assert transport is not None
                    try:
                        sock = transport.open_channel(
                            "direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0), timeout=connect_timeout
                        )
                    except (paramiko.SSHException, OSError) as exc:
                        raise ClusterError(
                            f"Bastion {hop.address} could not open a connection to {nxt.hostname}:{nxt.port}: {exc}.",
                            hint="Check the ProxyJump and HostName lines in ~/.ssh/config.",
                        ) from None
        except BaseException:
            for client in reversed(clients):
                client.close()
            raise
        return cls(target=target, _clients=clients)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def description(self) -> str:
        """`user@host:port` (and the alias the user wrote, if any)."""
        t = self.target
        return t.address if t.name == t.hostname else f"{t.name} ({t.address})"

    @property
    def _client(self) -> paramiko.SSHClient:
        return self._clients[-1]

    def _transport(self) -> paramiko.Transport:
        transport = self._client.get_transport() if self._clients else None
        if transport is None or not transport.is_active():
            raise ConnectionLost(
                f"The SSH connection to {self.description} is closed.",
                hint="Check the network and run the command again.",
            )
        return transport

    @property
    def connected(self) -> bool:
        """Whether the connection is still up (as far as this side knows)."""
        transport = self._client.get_transport() if self._clients else None
        return transport is not None and transport.is_active()

    def _lost(self, what: str, exc: BaseException) -> ConnectionLost:
        self._sftp = None  # an SFTP session does not survive its transport
        return ConnectionLost(
            f"Lost the SSH connection to {self.description} while {what} ({exc or type(exc).__name__}).",
            hint="Run the command again; nothing half-done is kept.",
        )

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        timeout: float | None = None,
        check: bool = True,
        stdin: str | bytes | None = None,
    ) -> RunResult:
        """Run a command to completion; `check` raises ClusterError on a non-zero exit."""
        cmd = command_line(argv)
        result = self._exec(cmd, stdin=stdin, hold_stdin=False, timeout=timeout, on_line=None)
        return check_result(result, cmd, self.description) if check else result

    def stream(
        self,
        argv: Sequence[str] | str,
        *,
        on_line: LineCallback,
        timeout: float | None = None,
        hold_stdin: bool = False,
    ) -> RunResult:
        """Run a command, calling `on_line(stream, line)` for each output line as it arrives."""
        return self._exec(command_line(argv), stdin=None, hold_stdin=hold_stdin, timeout=timeout, on_line=on_line)

    def _exec(
        self,
        cmd: str,
        *,
        stdin: str | bytes | None,
        hold_stdin: bool,
        timeout: float | None,
        on_line: LineCallback | None,
    ) -> RunResult:
        log.debug("[%s] $ %s", self.description, cmd)
        try:
            chan = self._transport().open_session(timeout=30)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if not self.connected:
                raise self._lost("starting a command", exc) from None
            raise ClusterError(f"Cannot start a command on {self.description}: {exc}.") from None
        sink = on_line or (lambda _s, _l: None)
        out, err = LineBuffer("stdout", sink), LineBuffer("stderr", sink)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            chan.exec_command(cmd)
            if stdin is not None:
                chan.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
            if not hold_stdin:
                chan.shutdown_write()
            drained_by = None  # after the exit status: how long to wait for the output still in flight
            while True:
                got = False
                while chan.recv_ready():
                    out.feed(chan.recv(65536))
                    got = True
                while chan.recv_stderr_ready():
                    err.feed(chan.recv_stderr(65536))
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    # sshd may send the exit status before the last of the output: wait for its EOF (bounded,
                    # since a background process the command left may hold the output open)
                    if chan.eof_received:
                        break
                    drained_by = drained_by or time.monotonic() + EOF_GRACE_S
                    if time.monotonic() > drained_by:
                        break
                if chan.closed and not got:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise ClusterError(f"Command timed out after {timeout:g} s on {self.description}: {shorten(cmd)}")
                if not got:
                    select.select([chan], [], [], 0.05 if drained_by else 0.5)
            # drain what arrived with the exit status
            while chan.recv_ready():
                out.feed(chan.recv(65536))
            while chan.recv_stderr_ready():
                err.feed(chan.recv_stderr(65536))
            status = chan.recv_exit_status() if chan.exit_status_ready() else -1
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(f"running: {shorten(cmd)}", exc) from None
        finally:
            chan.close()
        if status == -1:
            self._sftp = None
            raise ConnectionLost(
                f"Lost the SSH connection to {self.description} while running: {shorten(cmd)}.",
                hint="Run the command again; nothing half-done is kept.",
            )
        return RunResult(status, out.finish(), err.finish())

    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._transport()
            try:
                self._sftp = self._client.open_sftp()
            except (paramiko.SSHException, OSError, EOFError) as exc:
                if not self.connected:
                    raise self._lost("opening SFTP", exc) from None
                raise ClusterError(f"Cannot open an SFTP session on {self.description}: {exc}.") from None
        return self._sftp

    def put(self, local: Path, remote: str) -> None:
        """Upload a file: to a temporary name beside `remote`, then renamed into place."""
        log.debug("[%s] put %s -> %s", self.description, local, remote)
        directory, name = os.path.split(remote)
        if directory:
            self.run(["mkdir", "-p", directory])
        tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:8]}.tmp")
        sftp = self._sftp_client()
        try:
            sftp.put(str(local), tmp)
            sftp.chmod(tmp, os.stat(local).st_mode & 0o777)
            sftp.posix_rename(tmp, remote)
        except OSError as exc:
            self._remove_quietly(tmp)
            raise ClusterError(f"Cannot upload {local} to {self.description}:{remote}: {exc}.") from None

    def get(self, remote: str, local: Path) -> None:
        """Download a file to a temporary name beside `local`, then rename it into place."""
        log.debug("[%s] get %s -> %s", self.description, remote, local)
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            self._sftp_client().get(remote, str(tmp))
            os.replace(tmp, local)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise ClusterError(f"Cannot download {self.description}:{remote}: {exc}.") from None

    def read_text(self, path: str) -> str:
        """The content of a remote text file."""
        log.debug("[%s] read %s", self.description, path)
        try:
            with self._sftp_client().open(path, "r") as f:
                return f.read().decode("utf-8", errors="replace")
        except OSError as exc:
            raise ClusterError(f"Cannot read {self.description}:{path}: {exc}.") from None

    def read_text_if_exists(self, path: str) -> str | None:
        """The content of a remote text file, or None if it does not exist."""
        data = self.read_bytes_from(path, 0)
        return None if data is None else data.decode("utf-8", errors="replace")

    def read_bytes_from(self, path: str, offset: int) -> bytes | None:
        """A remote file's bytes from `offset` on (None if it does not exist)."""
        log.debug("[%s] read %s from %d", self.description, path, offset)
        try:
            with self._sftp_client().open(path, "rb") as f:
                if offset:
                    f.seek(offset)
                f.prefetch()
                return f.read()
        except FileNotFoundError:
            return None
        except (paramiko.SSHException, EOFError) as exc:
            raise self._lost(f"reading {path}", exc) from None
        except OSError as exc:
            if not self.connected:
                raise self._lost(f"reading {path}", exc) from None
            raise ClusterError(f"Cannot read {self.description}:{path}: {exc}.") from None

    def write_text_atomic(self, path: str, text: str, *, mode: int = 0o644) -> None:
        """Write a remote file to a temporary name beside it, then rename it into place."""
        log.debug("[%s] write %s", self.description, path)
        directory, name = os.path.split(path)
        if directory:
            self.run(["mkdir", "-p", directory])
        tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:8]}.tmp")
        sftp = self._sftp_client()
        try:
            with sftp.open(tmp, "w") as f:
                f.write(text.encode("utf-8"))
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except OSError as exc:
            self._remove_quietly(tmp)
            raise ClusterError(f"Cannot write {self.description}:{path}: {exc}.") from None

    def _remove_quietly(self, path: str) -> None:
        with contextlib.suppress(OSError):  # it may never have been created
            self._sftp_client().remove(path)

    def exists(self, path: str) -> bool:
        """Whether a remote path exists."""
        log.debug("[%s] exists %s", self.description, path)
        try:
            self._sftp_client().lstat(path)
        except FileNotFoundError:
            return False
        except (paramiko.SSHException, EOFError) as exc:
            raise self._lost(f"checking {path}", exc) from None
        except OSError as exc:
            if not self.connected:
                raise self._lost(f"checking {path}", exc) from None
            raise ClusterError(f"Cannot check {self.description}:{path}: {exc}.") from None
        return True

    def close(self) -> None:
        """Close the SFTP session and every hop of the connection."""
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        for client in reversed(self._clients):
            client.close()
        self._clients = []
