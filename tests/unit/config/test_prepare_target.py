"""`deployment.prepare` writes a packaged model only into ckpteval's cache: a run.model elsewhere is the
user's own checkpoint, served as it is under its own name (never the packaged model under the user's path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.errors import ConfigError


def compiled(*overrides: str, cwd: Path):
    return compile_config(CompileRequest(configs=("tiny",), overrides=overrides, cwd=cwd))


def test_the_tiny_config_prepares_smollm2_in_the_cache(isolated_user: Path) -> None:
    c = compiled(cwd=isolated_user)
    assert c.config.deployment.prepare == "smollm2"
    assert c.config.deployment.checkpoint_path.endswith("/checkpoints/smollm2")
    assert c.config.deployment.served_model_name == "smollm2-135m-instruct"


def test_a_path_of_the_users_is_served_as_it_is_under_its_own_name(isolated_user: Path) -> None:
    mine = isolated_user / "ckpts" / "my-sft-iter2000"
    mine.mkdir(parents=True)
    c = compiled(f"run.model={mine}", cwd=isolated_user)
    assert c.config.deployment.prepare is None
    assert c.config.deployment.checkpoint_path == str(mine)
    assert c.config.deployment.served_model_name == "my-sft-iter2000"
    assert c.config.target.api_endpoint.model_id == "my-sft-iter2000"
    assert any("deployment.prepare smollm2 -> off" in n for n in c.notes)


def test_a_path_that_does_not_exist_is_refused_whatever_prepare_says(isolated_user: Path) -> None:
    typo = isolated_user / "typo" / "my-ckpt"
    with pytest.raises(ConfigError, match="does not exist"):
        compiled(f"run.model={typo}", cwd=isolated_user)
    with pytest.raises(ConfigError, match="does not exist"):
        compiled(f"run.model={typo}", "deployment.prepare=tiny", cwd=isolated_user)
    assert not typo.exists() and not typo.parent.exists()  # nothing was written there


def test_a_name_the_user_set_is_kept(isolated_user: Path) -> None:
    mine = isolated_user / "ckpt"
    mine.mkdir()
    c = compiled(f"run.model={mine}", "deployment.served_model_name=mine", cwd=isolated_user)
    assert c.config.deployment.served_model_name == "mine"
