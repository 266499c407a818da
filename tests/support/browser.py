"""Debian's chromium, headless: what the tests of rendered pages (the report, Inspect's viewer) read."""

from __future__ import annotations

import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")


def dump_dom(url: str, *flags: str, timeout: float = 120) -> str:
    """The page at `url` as chromium has rendered it (`--dump-dom`), with extra command-line `flags`."""
    assert CHROMIUM is not None, "needs Debian's chromium (apt-get install chromium)"
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", *flags, "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    ).stdout
