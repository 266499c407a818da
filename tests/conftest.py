"""Shared fixtures: every test runs with its own HOME, XDG dirs and working directory, so a developer's
real env.toml, W&B login or invocation records never leak into (or out of) a test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated_user(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path_factory.mktemp("user")
    home = root / "home"
    work = root / "work"
    for d in (home, work):
        d.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    for var in ("CKPTEVAL_ENV_FILE", "CKPTEVAL_CONFIG_PATH", "CKPTEVAL_STATE_DIR", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    # Keep the real cache (prepared checkpoints are expensive) unless a test overrides it.
    monkeypatch.setenv("XDG_CACHE_HOME", os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")))
    # ...but the dataset cache (`evaluate data fetch`) is the test's own: what is in it changes what a run reads
    monkeypatch.setenv("CKPTEVAL_DATA_CACHE", str(root / "data-cache"))
    monkeypatch.chdir(work)
    return work


@pytest.fixture
def write_env(isolated_user: Path):
    """Write an env.toml into the working directory (the walk-up search finds it)."""

    def write(text: str, name: str = "env.toml") -> Path:
        path = isolated_user / name
        path.write_text(text)
        return path

    return write
