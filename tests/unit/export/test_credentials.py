"""Finding the W&B key (environment, `wandb login`'s netrc, wandb's settings file) and carrying it to a
job in an owner-only file — with wandb's own readers and real files, never printing the key."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ckpteval.cluster.remote import LocalRemote
from ckpteval.errors import ExportError
from ckpteval.export.credentials import (
    WandbKey,
    announce_login,
    find_wandb_key,
    key_file_path,
    read_key_file,
    wandb_mode,
    write_key_file,
)
from ckpteval.notices import show_notices
from tests.support.wandb_login import fake_key, write_netrc


def test_the_environment_key_wins_over_the_login(wandb_home: Path):
    write_netrc(wandb_home, fake_key("n"))
    key = find_wandb_key({"WANDB_API_KEY": fake_key("e")})
    assert key is not None
    assert (key.value, key.origin, key.source) == (fake_key("e"), "env", "WANDB_API_KEY")


def test_the_netrc_of_wandb_login_is_found_and_announced_without_the_key(
    wandb_home: Path, capsys: pytest.CaptureFixture[str]
):
    netrc = write_netrc(wandb_home, fake_key("n"))
    key = find_wandb_key({})
    assert key is not None
    assert (key.value, key.origin, key.source) == (fake_key("n"), "login", str(netrc))
    show_notices()  # as the CLI does
    announce_login(key)
    announce_login(key)  # once per process is enough
    captured = capsys.readouterr()
    assert captured.err.count("Detected W&B login") == 1
    assert str(netrc) in captured.err
    assert fake_key("n") not in captured.out + captured.err


def test_a_key_in_wandbs_settings_file_is_found(wandb_home: Path):
    settings = wandb_home / ".config" / "wandb" / "settings"
    settings.parent.mkdir(parents=True)
    settings.write_text(f"[default]\napi_key = {fake_key('s')}\n")
    key = find_wandb_key({"WANDB_CONFIG_DIR": str(settings.parent)})
    assert key is not None
    assert (key.value, key.origin, key.source) == (fake_key("s"), "login", "wandb settings")


def test_a_self_hosted_server_uses_its_own_netrc_entry(wandb_home: Path):
    write_netrc(wandb_home, fake_key("h"), machine="wandb.example.org:8080")
    assert find_wandb_key({}) is None  # not a key for the default host
    key = find_wandb_key({"WANDB_BASE_URL": "http://wandb.example.org:8080"})
    assert key is not None and key.value == fake_key("h")


def test_no_login_means_no_key(wandb_home: Path):
    assert find_wandb_key({}) is None
    assert find_wandb_key({"WANDB_API_KEY": "   "}) is None


def test_the_key_never_shows_in_repr_or_str():
    key = WandbKey(value=fake_key("r"), origin="env", source="WANDB_API_KEY")
    assert fake_key("r") not in repr(key)
    assert fake_key("r") not in str(key)
    assert fake_key("r") not in f"{key!r} {key}"


@pytest.mark.parametrize(
    ("value", "mode"),
    [(None, "online"), ("online", "online"), ("offline", "offline"), ("dryrun", "offline"), ("disabled", "disabled")],
)
def test_wandb_mode(value: str | None, mode: str):
    assert wandb_mode({} if value is None else {"WANDB_MODE": value}) == mode


def test_the_key_file_is_readable_only_by_its_owner(tmp_path: Path):
    job_dir = tmp_path / "job"
    (job_dir / ".secrets").mkdir(parents=True, mode=0o755)  # a directory left too open must be tightened
    key = WandbKey(value=fake_key("f"), origin="env", source="WANDB_API_KEY")
    with LocalRemote() as remote:
        path = write_key_file(remote, str(job_dir), key)
    assert path == key_file_path(str(job_dir)) == str(job_dir / ".secrets" / "wandb_api_key")
    assert stat.S_IMODE(os.stat(job_dir / ".secrets").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.stat(path).st_uid == os.getuid()
    assert [p.name for p in (job_dir / ".secrets").iterdir()] == ["wandb_api_key"]  # no temporary left
    back = read_key_file(path)
    assert (back.value, back.origin, back.source) == (fake_key("f"), "file", path)


def test_a_key_file_others_can_read_is_refused(tmp_path: Path):
    path = tmp_path / "wandb_api_key"
    path.write_text(fake_key("g"))
    path.chmod(0o640)
    with pytest.raises(ExportError, match="readable by others") as info:
        read_key_file(path)
    assert fake_key("g") not in str(info.value)


def test_a_missing_empty_or_symlinked_key_file_is_refused(tmp_path: Path):
    with pytest.raises(ExportError, match="does not exist"):
        read_key_file(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(ExportError, match="is empty"):
        read_key_file(empty)
    link = tmp_path / "link"
    link.symlink_to(empty)
    with pytest.raises(ExportError, match="Cannot open"):
        read_key_file(link)
