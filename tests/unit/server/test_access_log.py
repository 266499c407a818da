"""`--access-log`: one plain line per request, also when the server's output is a terminal. uvicorn colours
its access lines whenever stdout looks like one (a Slurm step's did): `"\x1b[1mPOST /v1/completions ...`, which
no reader counting `"POST /v1/...` lines finds (the access log looked empty on Slurm)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from tests.deploy_support import free_port, request_json


def test_the_access_log_is_plain_lines_on_a_terminal(tiny_checkpoint: Path) -> None:
    port = free_port()
    main, terminal = pty.openpty()  # the server's stdout and stderr: a terminal
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "ckpteval.server", "serve", "--checkpoint", str(tiny_checkpoint)),
            *("--port", str(port), "--device", "cpu", "--served-model-name", "tiny", "--access-log"),
        ],
        stdout=terminal,
        stderr=terminal,
        env={**os.environ, "TERM": "xterm-256color"},
    )
    os.close(terminal)
    out = b""

    def read(until: bytes, timeout: float) -> None:
        nonlocal out
        deadline = time.monotonic() + timeout
        while until not in out and time.monotonic() < deadline and proc.poll() is None:
            if select.select([main], [], [], 0.5)[0]:
                try:
                    out += os.read(main, 65536)
                except OSError:
                    return

    try:
        read(b"Ctrl-C stops it", 300)
        assert b"Ctrl-C stops it" in out, out.decode(errors="replace")
        status, _ = request_json(
            "POST", f"http://127.0.0.1:{port}/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1}
        )
        assert status == 200
        read(b'"POST /v1/completions HTTP/1.1" 200', 30)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        os.close(main)
    text = out.decode(errors="replace")
    assert '"POST /v1/completions HTTP/1.1" 200' in text, text[-2000:]
    assert "\x1b[" not in text.split("Ctrl-C stops it", 1)[1], text[-2000:]  # no colour codes
