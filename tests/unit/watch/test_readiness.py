"""The save-dir listing: one shell command, run for real (here through LocalRemote), on real directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpteval.cluster.remote import LocalRemote
from ckpteval.errors import ConfigError
from ckpteval.watch.readiness import list_save_dir, listing_command, parse_listing


def _iter_dir(root: Path, iteration: int, *files: str) -> Path:
    path = root / f"iter_{iteration:07d}"
    path.mkdir(parents=True)
    for name in ("__0_0.distcp", *files):
        (path / name).write_bytes(b"x")
    return path


def test_only_completely_written_iterations_are_ready(tmp_path: Path):
    root = tmp_path / "run 42" / "checkpoints"  # a space in the path: quoted in the command
    _iter_dir(root, 100, "common.pt", ".metadata", "metadata.json")
    _iter_dir(root, 200, "common.pt")  # shards written, index and marker not yet
    _iter_dir(root, 300, "common.pt", ".metadata")  # crashed before the finalize step
    _iter_dir(root, 1000, "common.pt", ".metadata", "metadata.json")
    (root / "latest_checkpointed_iteration.txt").write_text("100")
    (root / "iter_0000400").write_text("a file, not a save")
    (root / "iter_bogus").mkdir()
    (root / "tokenizer").mkdir()

    listing = list_save_dir(LocalRemote(), str(root))
    assert listing.exists and listing.tracker == "100"
    assert [c.iteration for c in listing.checkpoints] == [100, 200, 300, 1000]
    assert [c.iteration for c in listing.ready] == [100, 1000]
    by_iter = {c.iteration: c for c in listing.checkpoints}
    assert by_iter[200].missing == [".metadata", "metadata.json"]
    assert by_iter[300].missing == ["metadata.json"]
    assert by_iter[100].tracker_reached and not by_iter[1000].tracker_reached
    assert by_iter[1000].path == str(root / "iter_0001000")


def test_a_missing_or_empty_save_dir_lists_nothing(tmp_path: Path):
    missing = list_save_dir(LocalRemote(), str(tmp_path / "not-yet"))
    assert not missing.exists and missing.checkpoints == ()
    (tmp_path / "empty").mkdir()
    empty = list_save_dir(LocalRemote(), str(tmp_path / "empty"))
    assert empty.exists and empty.checkpoints == () and empty.tracker is None


def test_one_command_whatever_the_number_of_checkpoints(tmp_path: Path):
    class CountingRemote(LocalRemote):
        calls = 0

        def run(self, argv, **kwargs):  # type: ignore[no-untyped-def]
            CountingRemote.calls += 1
            return super().run(argv, **kwargs)

    for i in range(1, 41):
        _iter_dir(tmp_path, i * 10, "common.pt", ".metadata", "metadata.json")
    listing = list_save_dir(CountingRemote(), str(tmp_path))
    assert len(listing.ready) == 40
    assert CountingRemote.calls == 1


def test_relative_save_dirs_and_odd_output_are_refused_or_ignored():
    with pytest.raises(ConfigError, match="absolute"):
        list_save_dir(LocalRemote(), "checkpoints")
    listing = parse_listing("/x", "present\ntracker release\ndir iter_0000010 common.pt\nnoise line\n")
    assert listing.tracker == "release"
    assert [c.iteration for c in listing.checkpoints] == [10]
    assert not listing.checkpoints[0].tracker_reached
    assert "'/x; rm -rf /'" in listing_command("/x; rm -rf /")
