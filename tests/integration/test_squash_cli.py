"""`evaluate squash` as a user runs it: a real process, a real env.toml, the real test cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from ckpteval.cluster.images import sqsh_name
from tests.integration.conftest import Infra


def evaluate(*args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "200"}
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-c", "from ckpteval.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_squash_by_hand_then_cache_hit(write_env_toml, infra: Infra, remote_job_dir):
    env_file = write_env_toml("MY-CLUSTER")
    tag = uuid.uuid4().hex[:8]
    image = f"nvcr.io/ckpteval-test/fake-delay-2:{tag}"
    first = evaluate("squash", image, "--run", "MY-CLUSTER", "--env-file", str(env_file))
    assert first.returncode == 0, first.stderr
    path = f"{remote_job_dir}/containers/{sqsh_name(image)}"
    assert f"importing {image} on a compute node" in first.stdout
    assert "[INFO] Downloading layer" in first.stdout  # enroot's progress is shown
    assert f"✓ {image} -> {path} (imported in" in first.stdout
    assert Path(path).read_bytes()[:4] == b"hsqs"

    second = evaluate("squash", image, "--run", "MY-CLUSTER", "--env-file", str(env_file))
    assert second.returncode == 0, second.stderr
    assert f"✓ {image} -> {path} (cache hit)" in second.stdout
    assert len(infra.enroot_calls(tag)) == 1


def test_dry_run_connects_to_nothing_and_check_is_read_only(write_env_toml, infra: Infra, remote_job_dir):
    image = f"nvcr.io/ckpteval-test/plan:{uuid.uuid4().hex[:8]}"
    offline = write_env_toml("MY-CLUSTER", host="no-such-host.invalid")
    dry = evaluate("squash", image, "--run", "MY-CLUSTER", "--env-file", str(offline), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "Squash plan" in dry.stdout and "import if missing" in dry.stdout
    assert f"{remote_job_dir}/containers/{sqsh_name(image)}" in dry.stdout

    online = write_env_toml("MY-CLUSTER")
    checked = evaluate("squash", image, "--run", "MY-CLUSTER", "--env-file", str(online), "--dry-run", "--check")
    assert checked.returncode == 0, checked.stderr
    assert "checked on 127.0.0.1" in checked.stdout
    (row,) = [line for line in checked.stdout.splitlines() if image in line]
    assert row.split()[-2] == "import"  # the action column; the last word is the panel's border
    assert not os.path.exists(remote_job_dir)  # nothing was created


def test_errors_are_one_line_and_a_hint(write_env_toml, infra: Infra, tmp_path):
    home = tmp_path / "empty-home"
    (home / ".ssh").mkdir(parents=True)
    env_file = write_env_toml("MY-CLUSTER")
    unknown = evaluate("squash", "ubuntu:22.04", "--run", "MY-CLUSTER", "--env-file", str(env_file), home=home)
    assert unknown.returncode == 1
    assert unknown.stderr.startswith(f"error: The host key of [{infra.ssh_host}]:{infra.ssh_port} is not known")
    assert f"ssh-keyscan -p {infra.ssh_port} {infra.ssh_host} >> ~/.ssh/known_hosts" in unknown.stderr
    assert "Traceback" not in unknown.stderr

    bad = evaluate("squash", "img:1;touch /tmp/x", "--run", "MY-CLUSTER", "--env-file", str(env_file))
    assert bad.returncode == 2
    assert "is not a container image reference" in bad.stderr and "Traceback" not in bad.stderr

    missing = evaluate("squash", "ubuntu:22.04", "--run", "NOPE", "--env-file", str(env_file))
    assert missing.returncode == 2 and "Unknown profile 'NOPE'" in missing.stderr
