"""`connect_remote(profile)`: the Remote a profile reaches its cluster through.

Kept apart from the interface (`ckpteval.cluster.remote`) so that the SSH implementation, which
builds on that interface, is not imported by it.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from typing import TYPE_CHECKING

from ckpteval.cluster.remote import LocalRemote, Remote

if TYPE_CHECKING:
    from ckpteval.config.profiles import Profile


def connect_remote(profile: Profile, *, connect_timeout: float = 20.0) -> Remote:
    """The Remote for a profile: this machine for tunnel="local", an SSH connection otherwise.

    Raises ClusterError (unknown host key, authentication failure, unreachable host) with a hint.
    """
    from ckpteval.config.executors import remote_part

    if remote_part(profile).tunnel == "local":
        return LocalRemote()
    from ckpteval.cluster.ssh import SSHRemote  # paramiko: only when a profile needs SSH

    return SSHRemote.connect(profile, connect_timeout=connect_timeout)
