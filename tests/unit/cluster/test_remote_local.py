"""LocalRemote (tunnel = "local") and what is shared by every Remote: quoting, errors, files."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from ckpteval.cluster.remote import LocalRemote, Remote, RunResult, command_line
from ckpteval.errors import ClusterError


def test_command_line_quotes_each_word():
    assert command_line(["echo", "a b", "$(id)", "it's"]) == "echo 'a b' '$(id)' 'it'\"'\"'s'"
    assert command_line("echo $HOME | wc -c") == "echo $HOME | wc -c"
    with pytest.raises(ValueError):
        command_line([])


def test_local_remote_is_a_remote():
    assert isinstance(LocalRemote(), Remote)


def test_run_passes_words_verbatim_and_logs_the_command(tmp_path, caplog):
    canary = tmp_path / "canary"
    words = ["a b", f"$(touch {canary})", f"; touch {canary}", "*"]
    with caplog.at_level(logging.DEBUG, logger="ckpteval.remote"):
        result = LocalRemote().run(["printf", "%s\\n", *words])
    assert result == RunResult(0, "\n".join(words) + "\n", "")
    assert not canary.exists()
    assert any("printf" in r.getMessage() and "'a b'" in r.getMessage() for r in caplog.records)


def test_run_failures_timeouts_and_missing_programs():
    remote = LocalRemote()
    with pytest.raises(ClusterError, match=r"(?s)exit 3.*boom"):
        remote.run("echo boom >&2; exit 3")
    assert remote.run("exit 3", check=False).returncode == 3
    with pytest.raises(ClusterError, match=r"timed out after 0\.5 s"):
        remote.run(["sleep", "5"], timeout=0.5)
    assert remote.run(["no-such-program-xyz"], check=False).returncode == 127
    assert remote.run(["cat"], stdin="in\n").stdout == "in\n"


def test_stream_reports_lines_in_order_with_their_stream():
    seen: list[tuple[str, str]] = []
    result = LocalRemote().stream("echo a; echo b >&2; printf tail", on_line=lambda s, line: seen.append((s, line)))
    assert result.returncode == 0 and result.stdout == "a\ntail"
    assert ("stdout", "a") in seen and ("stderr", "b") in seen and ("stdout", "tail") in seen


def test_stream_can_hold_stdin_open_until_the_command_ends():
    # with stdin held, `read` sees no end-of-file and times out (status > 128); without, EOF at once (1)
    probe = ["bash", "-c", "read -t 1 line; echo $?"]
    held = LocalRemote().stream(probe, on_line=lambda s, line: None, hold_stdin=True)
    assert int(held.stdout) > 128
    closed = LocalRemote().stream(probe, on_line=lambda s, line: None)
    assert int(closed.stdout) == 1


def test_files_are_written_atomically(tmp_path):
    remote = LocalRemote()
    target = tmp_path / "deep" / "dir" / "f.txt"
    remote.write_text_atomic(str(target), "x\n", mode=0o600)
    assert target.read_text() == "x\n" and oct(target.stat().st_mode & 0o777) == "0o600"
    assert remote.read_text(str(target)) == "x\n"
    assert os.listdir(target.parent) == ["f.txt"]
    remote.put(target, str(tmp_path / "copy.txt"))
    remote.get(str(tmp_path / "copy.txt"), tmp_path / "back" / "f.txt")
    assert (tmp_path / "back" / "f.txt").read_text() == "x\n"
    assert remote.exists(str(target)) and not remote.exists(str(tmp_path / "nope"))
    with pytest.raises(ClusterError, match="Cannot read"):
        remote.read_text(str(tmp_path / "nope"))
    with pytest.raises(ClusterError, match="Cannot copy"):
        remote.get(str(tmp_path / "nope"), tmp_path / "x")
    assert not (tmp_path / "x").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back", "copy.txt", "deep"]


def test_unwritable_target_is_a_cluster_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    # root ignores permissions: use a path under a file instead
    target = Path("/proc/version/x") if os.access(ro, os.W_OK) else ro / "f"
    with pytest.raises(ClusterError, match="Cannot write"):
        LocalRemote().write_text_atomic(str(target), "x")
