"""Finding a checkpoint's pieces on disk, and the message for each missing one (no torch needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpteval.deploy.layout import TRACKER_FILE, locate_checkpoint
from ckpteval.errors import DeploymentError


def make_checkpoint(
    root: Path, *, iteration: str = "1000", backend: str = "torch_dist", tokenizer: str = "root"
) -> Path:
    """A directory with the files a torch_dist checkpoint has (contents are not read by locate)."""
    name = "release" if iteration == "release" else f"iter_{int(iteration):07d}"
    iter_dir = root / name
    iter_dir.mkdir(parents=True)
    (root / TRACKER_FILE).write_text(iteration + "\n")
    (iter_dir / "metadata.json").write_text(json.dumps({"sharded_backend": backend, "sharded_backend_version": 1}))
    (iter_dir / "common.pt").write_bytes(b"")
    (iter_dir / ".metadata").write_bytes(b"")
    tok_dir = {"root": root, "iter": iter_dir}.get(tokenizer)
    if tok_dir is not None:
        (tok_dir / "tokenizer").mkdir()
        (tok_dir / "tokenizer" / "tokenizer.json").write_text("{}")
    return iter_dir


def test_root_resolves_to_the_tracked_iteration(tmp_path: Path) -> None:
    iter_dir = make_checkpoint(tmp_path / "ck")
    layout = locate_checkpoint(tmp_path / "ck")
    assert layout.iter_dir == iter_dir.resolve()
    assert layout.iteration == 1000
    assert layout.tokenizer_dir == (tmp_path / "ck" / "tokenizer").resolve()


def test_iter_dir_is_accepted_and_finds_the_root_tokenizer(tmp_path: Path) -> None:
    iter_dir = make_checkpoint(tmp_path / "ck")
    layout = locate_checkpoint(iter_dir)
    assert layout.root == (tmp_path / "ck").resolve()
    assert layout.iteration == 1000
    assert layout.tokenizer_dir == (tmp_path / "ck" / "tokenizer").resolve()


def test_release_and_tokenizer_inside_the_iteration(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "ck", iteration="release", tokenizer="iter")
    layout = locate_checkpoint(tmp_path / "ck")
    assert layout.iteration is None
    assert layout.tokenizer_dir == (tmp_path / "ck" / "release" / "tokenizer").resolve()


def test_missing_tokenizer_is_not_an_error_here(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "ck", tokenizer="none")
    assert locate_checkpoint(tmp_path / "ck").tokenizer_dir is None


def expect_error(path: Path, *fragments: str) -> DeploymentError:
    with pytest.raises(DeploymentError) as info:
        locate_checkpoint(path)
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text
    return info.value


def test_missing_path(tmp_path: Path) -> None:
    expect_error(tmp_path / "nope", "does not exist", "evaluate prepare")


def test_a_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    expect_error(tmp_path / "f", "is a file")


def test_missing_tracker_lists_the_iterations_found(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / TRACKER_FILE).unlink()
    expect_error(tmp_path / "ck", f"{TRACKER_FILE} is missing", "iter_0001000")


def test_garbled_tracker(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / TRACKER_FILE).write_text("latest please")
    expect_error(tmp_path / "ck", "iteration number or 'release'")


def test_tracker_names_a_missing_iteration(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / TRACKER_FILE).write_text("2000")
    expect_error(tmp_path / "ck", "iter_0002000", "does not exist")


def test_legacy_torch_format_is_named(tmp_path: Path) -> None:
    iter_dir = tmp_path / "ck" / "iter_0000005"
    (iter_dir / "mp_rank_00").mkdir(parents=True)
    (tmp_path / "ck" / TRACKER_FILE).write_text("5")
    error = expect_error(tmp_path / "ck", "legacy 'torch' format")
    assert error.hint and "torch_dist" in error.hint


def test_other_sharded_backend(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "ck", backend="zarr")
    expect_error(tmp_path / "ck", "'zarr'", "'torch_dist' only")


@pytest.mark.parametrize(("name", "what"), [("common.pt", "training args"), (".metadata", "tensor index")])
def test_missing_piece_is_named(tmp_path: Path, name: str, what: str) -> None:
    iter_dir = make_checkpoint(tmp_path / "ck")
    (iter_dir / name).unlink()
    expect_error(tmp_path / "ck", name, what)
