"""Every export test gets its own HOME (netrc, wandb settings, wandb's staging and cache dirs) and no
W&B or MLflow settings from the developer's environment."""

from __future__ import annotations

from pathlib import Path

import pytest

WANDB_VARS = (
    "WANDB_API_KEY",
    "WANDB_MODE",
    "WANDB_BASE_URL",
    "WANDB_ENTITY",
    "WANDB_PROJECT",
    "WANDB_DIR",
    "WANDB_IDENTITY_TOKEN_FILE",
    "NETRC",
    "MLFLOW_TRACKING_URI",
)


@pytest.fixture(autouse=True)
def wandb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in WANDB_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / ".config" / "wandb"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(home / ".cache" / "wandb"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(home / ".local" / "share" / "wandb"))
    return home
