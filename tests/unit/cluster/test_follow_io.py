"""Reading a job directory while it changes: incremental log lines, reconnecting after a dropped
connection, fetching results without caches. Real files through the LocalRemote seam."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpteval.cluster.fetch import fetch_job_dir
from ckpteval.cluster.jobview import LogTail, RemoteJobView
from ckpteval.cluster.remote import ConnectionLost, LocalRemote
from ckpteval.cluster.session import ClusterSession
from ckpteval.config.profiles import Profile, make_profile
from ckpteval.errors import ClusterError

PROFILE = make_profile(name="here", tunnel="local")


class FlakyRemote(LocalRemote):
    """A LocalRemote whose connection drops after `lives` reads (what a killed sshd looks like)."""

    def __init__(self, lives: int) -> None:
        self.lives = lives

    def _spend(self) -> None:
        self.lives -= 1
        if self.lives < 0:
            raise ConnectionLost("Lost the SSH connection to the cluster (test)")

    def read_bytes_from(self, path: str, offset: int) -> bytes | None:
        self._spend()
        return super().read_bytes_from(path, offset)

    def read_text_if_exists(self, path: str) -> str | None:
        self._spend()
        return super().read_text_if_exists(path)


def test_log_tail_yields_each_complete_line_once(tmp_path: Path):
    log = tmp_path / "job.log"
    tail = LogTail(ClusterSession(PROFILE, remote=LocalRemote()), str(log))
    assert tail.read() == []  # not there yet
    log.write_bytes(b"one\ntw")
    assert tail.read() == ["one"]
    with log.open("ab") as f:
        f.write("o ünïcode\nthree".encode())
    assert tail.read() == ["two ünïcode"]
    assert tail.read() == []
    assert tail.read(final=True) == ["three"]


def test_session_reconnects_and_repeats_the_read(tmp_path: Path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "deployment").write_text("ready\n")
    connects: list[int] = []
    notes: list[str] = []

    def connect(_profile: Profile) -> LocalRemote:
        connects.append(1)
        return FlakyRemote(lives=1)

    session = ClusterSession(PROFILE, connect=connect, on_reconnect=notes.append, retry_for=5)
    view = RemoteJobView(session, str(tmp_path))
    assert view.read_text("state/deployment") == "ready\n"  # first connection, first life
    assert view.read_text("state/deployment") == "ready\n"  # dropped: reconnected and read again
    assert len(connects) == 2 and session.reconnects == 1
    assert notes[0].startswith("connection lost") and notes[1] == "reconnected to this machine"


def test_session_gives_up_after_retry_for_with_a_clear_message():
    attempts: list[int] = []

    def connect(_profile: Profile) -> LocalRemote:
        attempts.append(1)
        if len(attempts) == 1:
            return FlakyRemote(lives=0)
        raise ClusterError("Cannot reach login:22: connection refused.")

    session = ClusterSession(PROFILE, connect=connect, retry_for=1.5)
    with pytest.raises(ClusterError) as err:
        session.call(lambda r: r.read_bytes_from("/nonexistent", 0))
    assert "could not reconnect within 2 s" in err.value.message
    assert "connection refused" in err.value.message
    assert "The job keeps running" in (err.value.hint or "")
    assert len(attempts) >= 2


def test_fetch_brings_results_not_caches_and_only_what_changed(tmp_path: Path):
    job = tmp_path / "job"
    files = {
        "state/finished": "0\n",
        "logs/job.log": "log\n",
        "tasks/adlr_mmlu/output/results.yml": "results: {}\n",
        "tasks/adlr_mmlu/output/lm-eval/results_2025.json": "{}\n",
        "tasks/adlr_mmlu/output/cache/responses/abc.json": "cached response\n",
        "tasks/adlr_mmlu/output/lm_cache/rank0.db": "sqlite\n",
        "tasks/adlr_mmlu/output/response_stats_cache/x": "x\n",
        "tasks/adlr_mmlu/output/.results.yml.1234.tmp": "half\n",
        "hook/sitecustomize.py": "# hook\n",
        "state/.lock": "",
    }
    for rel, text in files.items():
        (job / rel).parent.mkdir(parents=True, exist_ok=True)
        (job / rel).write_text(text)
    local = tmp_path / "copy"
    first = fetch_job_dir(LocalRemote(), str(job), local)
    assert sorted(first.copied) == [
        "logs/job.log",
        "state/finished",
        "tasks/adlr_mmlu/output/lm-eval/results_2025.json",
        "tasks/adlr_mmlu/output/results.yml",
    ]
    assert (local / "tasks/adlr_mmlu/output/results.yml").read_text() == "results: {}\n"
    assert fetch_job_dir(LocalRemote(), str(job), local).copied == ()  # nothing changed
    with (job / "logs/job.log").open("a") as f:
        f.write("more\n")
    os.utime(job / "logs/job.log", (1e9, 1e9))
    assert fetch_job_dir(LocalRemote(), str(job), local).copied == ("logs/job.log",)
    assert (local / "logs/job.log").read_text() == "log\nmore\n"


class CountingRemote(LocalRemote):
    """A LocalRemote that counts what reaches the cluster: commands and single-file reads."""

    def __init__(self) -> None:
        self.commands = 0
        self.reads = 0

    def run(self, argv, **kwargs):  # type: ignore[no-untyped-def]
        self.commands += 1
        return super().run(argv, **kwargs)

    def read_text_if_exists(self, path: str) -> str | None:
        self.reads += 1
        return super().read_text_if_exists(path)


def test_prefetch_answers_a_snapshot_from_one_command(tmp_path: Path):
    from ckpteval.execution.snapshot import take_snapshot

    job = tmp_path / "job"
    for rel, text in {
        "state/deployment": "ready\n",
        "tasks/a/state": "running\n",
        "tasks/a/output/progress": "7\n",
        "tasks/b/.done": "",
        "tasks/b/state": "succeeded\n",
    }.items():
        (job / rel).parent.mkdir(parents=True, exist_ok=True)
        (job / rel).write_text(text)
    (job / "tasks/a/client.log").write_text("x" * 100_000)  # large: listed, read only when asked
    remote = CountingRemote()
    view = RemoteJobView(ClusterSession(PROFILE, remote=remote), str(job))
    view.prefetch(["state", "tasks/a", "tasks/a/output", "tasks/b", "tasks/b/output"])

    from ckpteval.tasks.progress import Progress

    def progress(v, task_dir):  # type: ignore[no-untyped-def]
        text = v.read_text(f"{task_dir}/output/progress")
        return Progress(int(text) if text else 0, None)

    snap = take_snapshot(view, [("a", "tasks/a"), ("b", "tasks/b")], progress)
    assert (remote.commands, remote.reads) == (1, 0)  # the whole snapshot from one command
    assert snap.deployment == "ready" and snap.finished is None
    assert [(t.state, t.done) for t in snap.tasks] == [("running", 7), ("succeeded", 0)]
    assert view.read_text("tasks/a/client.log") == "x" * 100_000 and remote.reads == 1
    assert view.read_text("logs/job.log") is None and remote.reads == 2  # not prefetched: asked for
