"""Finding a checkpoint's pieces on disk, and the message for each missing one (no torch needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpteval.checkpoint.layout import TRACKER_FILE, locate_checkpoint
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


def make_legacy(root: Path, *ranks: str, state_file: bool = True) -> Path:
    """A legacy `torch` checkpoint's directories: iter_0000005/<rank>/model_optim_rng.pt (empty)."""
    iter_dir = root / "iter_0000005"
    for rank in ranks:
        (iter_dir / rank).mkdir(parents=True)
        if state_file:
            (iter_dir / rank / "model_optim_rng.pt").write_bytes(b"")
    (root / TRACKER_FILE).write_text("5")
    return iter_dir


def test_legacy_torch_format_saved_with_tp1_is_read(tmp_path: Path) -> None:
    make_legacy(tmp_path / "ck", "mp_rank_00")
    assert locate_checkpoint(tmp_path / "ck").ckpt_format == "torch"


def test_legacy_torch_format_without_its_state_file(tmp_path: Path) -> None:
    make_legacy(tmp_path / "ck", "mp_rank_00", state_file=False)
    expect_error(tmp_path / "ck", "legacy 'torch' format", "model_optim_rng.pt")


@pytest.mark.parametrize(
    ("ranks", "sizes"),
    [
        (("mp_rank_00", "mp_rank_01"), "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1"),
        (("mp_rank_00_000", "mp_rank_00_001"), "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2"),
        (
            ("mp_rank_00_000", "mp_rank_01_000", "mp_rank_00_001", "mp_rank_01_001"),
            "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2",
        ),
    ],
)
def test_legacy_torch_format_saved_model_parallel_gets_the_conversion_command(
    tmp_path: Path, ranks: tuple[str, ...], sizes: str
) -> None:
    make_legacy(tmp_path / "ck", *ranks)
    error = expect_error(tmp_path / "ck", "legacy 'torch' format", "TP=1 and PP=1 only")
    root = (tmp_path / "ck").resolve()
    assert error.hint and f"--load {root} --ckpt-format torch --ckpt-convert-format torch_dist" in error.hint
    assert sizes in error.hint
    assert f"serve {root}-converted/torch_dist" in error.hint


def test_other_sharded_backend(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "ck", backend="zarr")
    expect_error(tmp_path / "ck", "'zarr'", "'torch_dist' only")


@pytest.mark.parametrize(("name", "what"), [("common.pt", "training args"), (".metadata", "tensor index")])
def test_missing_piece_is_named(tmp_path: Path, name: str, what: str) -> None:
    iter_dir = make_checkpoint(tmp_path / "ck")
    (iter_dir / name).unlink()
    expect_error(tmp_path / "ck", name, what)
