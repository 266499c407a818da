"""One connection to the cluster for a long-lived command, reopened when it drops.

Following a job for hours over SSH outlives Wi-Fi hiccups, VPN renewals and sshd restarts. A
`ClusterSession` runs each operation on its connection; when the connection is lost
(`ConnectionLost`) it reconnects, with growing pauses, for up to `retry_for` seconds, and runs the
operation again. Operations passed to `call` must therefore be safe to repeat (reads, queries,
`scancel`), which everything the follow loop does is.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ckpteval.cluster.connect import connect_remote
from ckpteval.cluster.remote import ConnectionLost, Remote
from ckpteval.errors import ClusterError

if TYPE_CHECKING:
    from ckpteval.config.profiles import Profile

log = logging.getLogger("ckpteval.remote")
T = TypeVar("T")


class ClusterSession:
    """A Remote that is reopened when its connection drops."""

    def __init__(
        self,
        profile: Profile,
        *,
        remote: Remote | None = None,
        retry_for: float = 600.0,
        on_reconnect: Callable[[str], None] | None = None,
        connect: Callable[[Profile], Remote] = connect_remote,
    ) -> None:
        self.profile = profile
        self._remote = remote
        self._retry_for = retry_for
        self._on_reconnect = on_reconnect or (lambda _msg: None)
        self._connect = connect
        self.reconnects = 0

    @property
    def remote(self) -> Remote:
        """The current connection (opened on first use)."""
        if self._remote is None:
            self._remote = self._connect(self.profile)
        return self._remote

    @property
    def description(self) -> str:
        """Where commands run, for messages."""
        return self.remote.description

    def call(self, operation: Callable[[Remote], T]) -> T:
        """Run `operation` on the connection; on a lost connection, reconnect and run it again."""
        try:
            return operation(self.remote)
        except ConnectionLost as lost:
            self._reconnect(lost)
        return operation(self.remote)

    def _reconnect(self, lost: ConnectionLost) -> None:
        self._drop()
        deadline = time.monotonic() + self._retry_for
        pause = 1.0
        self._on_reconnect(f"connection lost ({lost.message}); reconnecting ...")
        last: ClusterError = lost
        while time.monotonic() < deadline:
            try:
                self._remote = self._connect(self.profile)
            except ClusterError as exc:  # unreachable for now: keep trying until the deadline
                last = exc
                log.debug("reconnect failed: %s", exc.message)
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(pause * 2, 30.0)
                continue
            self.reconnects += 1
            self._on_reconnect(f"reconnected to {self._remote.description}")
            return
        raise ClusterError(
            f"Lost the connection to the cluster and could not reconnect within {self._retry_for:.0f} s: "
            + last.message,
            hint="The job keeps running on the cluster. Follow it again with `evaluate logs -f INVOCATION` "
            "or check it with `evaluate status INVOCATION`.",
        )

    def _drop(self) -> None:
        if self._remote is not None:
            with contextlib.suppress(ClusterError, OSError, EOFError):  # it is already gone: best effort
                self._remote.close()
            self._remote = None

    def close(self) -> None:
        """Close the connection."""
        self._drop()

    def __enter__(self) -> ClusterSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
