"""SmolLM2 fixtures: the checkpoint is prepared once and cached across sessions (~35-70 s the first time)
in $CKPTEVAL_TEST_CACHE or the user's cache (where `evaluate -c tiny` finds it too); the server and the
in-process models once per session."""

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
def smollm2_checkpoint() -> Path:
    from ckpteval.deploy import default_checkpoint_dir, ensure_prepared

    cache = os.environ.get("CKPTEVAL_TEST_CACHE")
    return ensure_prepared("smollm2", Path(cache) / "smollm2" if cache else default_checkpoint_dir("smollm2"))


@pytest.fixture(scope="module")  # stopped once its module is done: it holds ~1.5-2 GiB
def smollm2_server(smollm2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(smollm2_checkpoint, tmp_path_factory.mktemp("smollm2-logs"), name="smollm2")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def smollm2_loaded(smollm2_checkpoint: Path) -> Any:
    """The converted checkpoint loaded in this process, as the server loads it."""
    from ckpteval.deploy.server import load_model

    return load_model(smollm2_checkpoint, device="cpu")


@pytest.fixture(scope="module")
def smollm2_hf() -> tuple[Any, Any]:
    """(tokenizer, transformers model) straight from the packaged GGUF: the reference."""
    from ckpteval.deploy.packaged import load_smollm2_hf

    return load_smollm2_hf()
