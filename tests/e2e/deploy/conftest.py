"""SmolLM2 fixtures: the checkpoint is prepared once and cached across sessions (~35-70 s the first time)
in $CKPTEVAL_TEST_CACHE or the user's cache (where `evaluate -c tiny` finds it too); the in-process models
once per module. The server is the session's shared one (`smollm2_server`, tests/e2e/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import packaged_checkpoint


@pytest.fixture(scope="session")
def smollm2_checkpoint() -> Path:
    return packaged_checkpoint("smol")


@pytest.fixture(scope="module")
def smollm2_loaded(smollm2_checkpoint: Path) -> Any:
    """The converted checkpoint loaded in this process, as the server loads it."""
    from ckpteval.server.serve import load_model

    return load_model(smollm2_checkpoint, device="cpu")


@pytest.fixture(scope="module")
def smollm2_hf() -> tuple[Any, Any]:
    """(tokenizer, transformers model) straight from the packaged GGUF: the reference."""
    from ckpteval.server.packaged import load_smollm2_hf

    return load_smollm2_hf()
