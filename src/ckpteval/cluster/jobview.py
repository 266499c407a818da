"""Reading a running job's directory on the cluster: its state files (a `JobView`) and its logs, incrementally.

Everything goes through a `ClusterSession`, so a dropped connection is reopened and the read repeated.
"""

from __future__ import annotations

import posixpath

from ckpteval.cluster.session import ClusterSession


class RemoteJobView:
    """A job directory on the cluster, read over SFTP (or directly, for tunnel = "local")."""

    def __init__(self, session: ClusterSession, job_dir: str) -> None:
        self.session = session
        self.job_dir = job_dir

    def path(self, rel: str) -> str:
        """The absolute path on the cluster of `rel` (relative to the job directory)."""
        return posixpath.join(self.job_dir, rel)

    def read_text(self, rel: str) -> str | None:
        """The file's text, or None when it does not exist (yet)."""
        path = self.path(rel)
        return self.session.call(lambda remote: remote.read_text_if_exists(path))


class LogTail:
    """New complete lines of a growing file on the cluster, one read per call.

    Reads from where the last call stopped (a byte offset); a line still being written is kept until
    its newline arrives, so a line is never split in two. The job's logs are only appended to.
    """

    def __init__(self, session: ClusterSession, path: str) -> None:
        self.session = session
        self.path = path
        self.offset = 0
        self._partial = b""

    def read(self, *, final: bool = False) -> list[str]:
        """The lines added since the last call (with `final`, also an unterminated last line)."""
        offset = self.offset
        data = self.session.call(lambda remote: remote.read_bytes_from(self.path, offset))
        if data is None:
            return []
        self.offset += len(data)
        buffer = self._partial + data
        *lines, self._partial = buffer.split(b"\n")
        if final and self._partial:
            lines.append(self._partial)
            self._partial = b""
        return [line.decode("utf-8", errors="replace").rstrip("\r") for line in lines]
