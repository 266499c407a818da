"""What a server tells its job: its own story (loading, serving, stopped), one line at a time on its stderr
(the deployment log), and the port it holds (`publish_port`).

Also told by the in-place stand-ins (`server.inplace_client`, `deploy.sglang_inplace`), which stand for a
server the job did not start.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path


def say(message: str) -> None:
    """A line of the server's own story (loading, serving, stopped) on its stderr: the deployment log."""
    announce = logging.getLogger("ckpteval.deploy.serve")
    if not announce.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        announce.addHandler(handler)
        announce.setLevel(logging.INFO)
        announce.propagate = False
    announce.info(message)


def publish_port(path: Path, port: int) -> None:
    """Write `port` to `path` atomically (a reader never sees half a number)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)
