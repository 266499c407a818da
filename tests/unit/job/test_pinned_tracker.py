"""A deployment that reads the checkpoint's tracker itself (Export-Deploy) starts only while the tracker names the
iteration the job pinned: the job script's check, run by bash as the job runs it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ckpteval.job.script import _pinned_tracker_check


def _run(tmp_path: Path, tracker_text: str | None) -> subprocess.CompletedProcess[str]:
    tracker = tmp_path / "ckpts" / "latest_checkpointed_iteration.txt"
    tracker.parent.mkdir(exist_ok=True)
    if tracker_text is not None:
        tracker.write_text(tracker_text)
    (tmp_path / "state").mkdir(exist_ok=True)
    script = "\n".join(
        [
            "say() { printf '%s\\n' \"$*\"; }",
            'mark() { printf \'%s\\n\' "$2" > "$1"; }',
            *_pinned_tracker_check(str(tracker), "1000"),
            "echo started",
        ]
    )
    return subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)


def test_the_deployment_starts_while_the_tracker_names_the_pinned_iteration(tmp_path: Path) -> None:
    done = _run(tmp_path, "1000\n")
    assert done.returncode == 0 and done.stdout.strip() == "started"


def test_a_tracker_that_moved_while_the_job_waited_fails_the_job_saying_why(tmp_path: Path) -> None:
    done = _run(tmp_path, "2000")
    assert done.returncode == 3 and "started" not in done.stdout
    assert "now names iteration 2000, not 1000" in done.stdout and "Submit again" in done.stdout
    assert (tmp_path / "state" / "deployment").read_text().strip() == "failed"
    (tmp_path / "elsewhere").mkdir()
    gone = _run(tmp_path / "elsewhere", None)  # no tracker at all
    assert gone.returncode == 3 and "names iteration missing" in gone.stdout
