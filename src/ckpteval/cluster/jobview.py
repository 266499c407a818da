"""Reading a running job's directory on the cluster: its state files (a `JobView`) and its logs, incrementally.

Everything goes through a `ClusterSession`, so a dropped connection is reopened and the read repeated.
"""

from __future__ import annotations

import posixpath

from ckpteval.cluster.session import ClusterSession

_LARGE = "\x01"  # a file prefetch listed without its content


class RemoteJobView:
    """A job directory on the cluster, read over SFTP (or directly, for tunnel = "local").

    `prefetch(dirs)` reads every small file directly in those directories with one remote command
    (a `find` and `cat`s): the follow loop calls it once per redraw, so a redraw costs one round trip
    instead of one SFTP open/read/close per state file. Until the next prefetch, a file in a prefetched
    directory is answered from it (absent there: None); any other file is read on demand.
    """

    MAX_PREFETCH_BYTES = 64 * 1024  # per file: state files, progress, run configs; not logs or results

    def __init__(self, session: ClusterSession, job_dir: str) -> None:
        self.session = session
        self.job_dir = job_dir
        self._files: dict[str, str] = {}
        self._dirs: set[str] = set()

    def path(self, rel: str) -> str:
        """The absolute path on the cluster of `rel` (relative to the job directory)."""
        return posixpath.join(self.job_dir, rel)

    def prefetch(self, dirs: list[str]) -> None:
        """Read every small file directly in `dirs` (relative to the job dir) with one remote command.

        Larger files (logs, results) are only listed: reading one of them goes to the cluster then.
        """
        script = (
            'cd "$1" 2>/dev/null || exit 0; shift; '
            "find \"$@\" -maxdepth 1 -type f -printf '%s %p\\n' 2>/dev/null | while read -r size f; do "
            f'if [ "$size" -lt {self.MAX_PREFETCH_BYTES} ]; then printf \'%s\\0\' "$f"; cat "$f" 2>/dev/null; '
            "printf '\\0'; else printf '%s\\0\\001\\0' \"$f\"; fi; done"
        )
        argv = ["sh", "-c", script, "ckpteval-prefetch", self.job_dir, *dirs]
        result = self.session.call(lambda remote: remote.run(argv, timeout=60, check=False))
        parts = result.stdout.split("\0")
        self._files = {posixpath.normpath(parts[i]): parts[i + 1] for i in range(0, len(parts) - 1, 2)}
        self._dirs = {posixpath.normpath(d) for d in dirs}

    def read_text(self, rel: str) -> str | None:
        """The file's text, or None when it does not exist (yet)."""
        key = posixpath.normpath(rel)
        if posixpath.dirname(key) in self._dirs:
            cached = self._files.get(key)
            if cached != _LARGE:
                return cached
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
