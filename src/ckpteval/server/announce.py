"""The server's own story (loading, serving, stopped), one line at a time on its stderr: the deployment log.

Also said by the in-place stand-in (`server.inplace_client`), which stands for a server the job did not start.
"""

from __future__ import annotations

import logging
import sys


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
