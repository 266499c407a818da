"""Session fixtures of the checkpoint and server tests: the tiny checkpoint (prepared once, ~25 s), a real
server on it, and the same model loaded in this process for computing expected values directly."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy_support import RunningServer, start_server

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ckpteval.server.prepare import prepare_checkpoint

    return prepare_checkpoint("tiny", tmp_path_factory.mktemp("deploy") / "tiny")


@pytest.fixture(scope="session")
def tiny_server(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tiny_checkpoint, tmp_path_factory.mktemp("server-logs"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_loaded(tiny_checkpoint: Path) -> Any:
    """The tiny model in this process (megatron's CPU runtime is set up once per session)."""
    from ckpteval.server.serve import load_model

    return load_model(tiny_checkpoint, device="cpu")
