"""A W&B login as `wandb login` leaves it, for tests (keys no server knows)."""

from __future__ import annotations

from pathlib import Path


def write_netrc(home: Path, key: str, machine: str = "api.wandb.ai") -> Path:
    """What `wandb login` leaves behind: a netrc entry for the W&B host."""
    path = home / ".netrc"
    path.write_text(f"machine {machine}\n  login user\n  password {key}\n")
    path.chmod(0o600)
    return path


def fake_key(tag: str) -> str:
    """A syntactically valid W&B key (40 characters) that no server knows."""
    return (tag * 40)[:40]
