"""The W&B key's whole trip to a detached Slurm job, on the real test cluster (sshd + Slurm).

A canary key is set as WANDB_API_KEY. The test compiles and previews the invocation (what a dry run
shows), submits a batch job as the CI user over SSH that runs the export step, and exports again
from here with `evaluate export`. The key must reach the job's wandb client (a local HTTP server
standing in for W&B sees it in the request's credentials), the offline run the job writes must hold
the metrics, and afterwards the canary must appear nowhere — not in any file written here or under
the remote job dir, not in ciuser's wandb dirs, not in Slurm's spool or logs, not in any output —
except in the key file, which must be mode 0600 in a 0700 directory, owned by the job's user.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.cli.preview import render_preview
from ckpteval.cluster.connect import connect_remote
from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.config.preview import PreviewPanel, config_yaml
from ckpteval.export.credentials import key_file_path
from ckpteval.export.job import export_step_command, stage_wandb_key
from ckpteval.invocation.record import InvocationRecord, TaskEntry, new_invocation_id
from tests.integration.conftest import REPO, Infra, trust_infra_host
from tests.support.jobdirs import make_job_dir
from tests.support.waiting import wait_until
from tests.support.wandb_offline import offline_run_dirs, read_offline_run

pytestmark = pytest.mark.slurm

JOB_PYTHON = str(REPO / ".venv" / "bin" / "python")


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Stands in for W&B: records the credentials each request carries, and refuses them."""

    seen: list[str]

    def _refuse(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        auth = self.headers.get("Authorization") or ""
        if auth.startswith("Basic "):
            self.seen.append(base64.b64decode(auth.split()[1]).decode(errors="replace"))
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"errors":[{"message":"unknown key"}]}')

    do_POST = do_GET = _refuse

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_wandb() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


@pytest.fixture
def home(tmp_path: Path, infra: Infra, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated $HOME (trusting the test sshd) with no W&B settings from the developer."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    trust_infra_host(home, infra)
    monkeypatch.setenv("HOME", str(home))
    for var in ("WANDB_MODE", "WANDB_BASE_URL", "WANDB_DIR", "NETRC", "WANDB_ENTITY", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    return home


def _files(roots: Iterable[Path], *, since: float = 0.0) -> Iterator[Path]:
    for root in roots:
        if root.is_file():
            yield root
            continue
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = Path(dirpath) / name
                try:
                    info = path.lstat()
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and info.st_mtime >= since and info.st_size < 64 * 1024 * 1024:
                    yield path


def _wait_for(job_id: str, timeout: float = 240) -> str:
    def ended() -> str:
        out = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True, check=False
        ).stdout.strip()
        state = out.split("\n")[0] if out else ""
        return state if state not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING") else ""

    return wait_until(ended, timeout=timeout, what=f"job {job_id} to end", interval=1)


def test_the_wandb_key_reaches_a_batch_job_only_through_its_owner_only_file(
    infra: Infra,
    remote_job_dir: str,
    write_env_toml: Callable[..., Path],
    ci_profile: Callable[..., Any],
    home: Path,
    tmp_path: Path,
    fake_wandb: tuple[str, list[str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    started = time.time() - 1
    ssh_log_offset = Path(infra.ssh_log).stat().st_size
    canary = ("ckptevalcanary" + uuid.uuid4().hex)[:40]
    monkeypatch.setenv("WANDB_API_KEY", canary)
    outputs: list[str] = []

    # 1. what a dry run shows: compiled config, and the job script's export step
    env_file = write_env_toml("CI", container_image="nvcr.io/nvidia/nemo:25.11")
    compiled = compile_config(
        CompileRequest(
            configs=("sft",),
            profile="CI",
            mode="batch",
            env_file=env_file,
            tasks=("adlr_mmlu", "hellaswag"),
            overrides=("run.model=/lustre/ckpts/sft", "export.wandb.project=ckpteval-it", "export.wandb.timeout=15"),
        )
    )
    invocation = new_invocation_id()
    job_dir = f"{remote_job_dir}/{invocation}"
    tasks = [(t.name, f"tasks/{t.dir_name}") for t in compiled.tasks]
    wandb_url, seen = fake_wandb
    online_step = export_step_command(
        JOB_PYTHON,
        job_dir,
        invocation=invocation,
        tasks=tasks,
        key_file=key_file_path(job_dir),
        environ={"WANDB_BASE_URL": wandb_url, "WANDB_API_KEY": canary},
    )
    offline_step = export_step_command(
        JOB_PYTHON,
        job_dir,
        invocation=invocation,
        tasks=tasks,
        key_file=key_file_path(job_dir),
        environ={"WANDB_MODE": "offline", "WANDB_API_KEY": canary},
    )
    script = "\n".join(["#!/usr/bin/env bash", "set -u", f"cd {job_dir}", online_step, offline_step, ""])
    monkeypatch.setenv("COLUMNS", "250")
    render_preview(compiled, invocation=invocation, panels=[PreviewPanel("job script", script, "bash")], dry_run=True)
    preview = capsys.readouterr()
    outputs += [preview.out, preview.err]
    assert f"--wandb-key-file {key_file_path(job_dir)}" in preview.out

    # 2. submission: job files, the key file (staged from WANDB_API_KEY), sbatch as ciuser over SSH
    local_job = tmp_path / "staged" / invocation
    make_job_dir(local_job, invocation, config_yaml=config_yaml(compiled))
    with connect_remote(ci_profile()) as remote:
        for path in sorted(p for p in local_job.rglob("*") if p.is_file()):
            remote.put(path, f"{job_dir}/{path.relative_to(local_job)}")
        key_file = stage_wandb_key(remote, job_dir, secrets=compiled.secrets)
        assert key_file == key_file_path(job_dir)
        remote.write_text_atomic(f"{job_dir}/export-job.sh", script, mode=0o755)
        submitted = remote.run(
            [
                "sbatch",
                "--parsable",
                "-A",
                infra.slurm_account,
                "-p",
                infra.slurm_partition,
                "-t",
                "00:05:00",
                "-J",
                f"ckpteval-export-{invocation}",
                "-o",
                f"{job_dir}/logs/export.log",
                f"{job_dir}/export-job.sh",
            ]
        )
        outputs += [submitted.stdout, submitted.stderr]
    captured = capsys.readouterr()
    outputs += [captured.out, captured.err]
    state = _wait_for(submitted.stdout.strip().split(";")[0])
    job_log = Path(job_dir, "logs", "export.log").read_text()
    outputs.append(job_log)
    assert state == "COMPLETED", job_log

    # the key reached the job's wandb client (it sent it to "W&B"), and only that way
    assert f"api:{canary}" in seen, job_log
    assert "export failed" in job_log  # the online attempt was refused: reported, not fatal
    # the offline export in the job holds the metrics and results
    (run_dir,) = offline_run_dirs(Path(job_dir))
    run = read_offline_run(run_dir)
    assert run.run_id == f"ckpteval-{invocation}"
    assert run.summary["adlr_mmlu/exact_match"] == 0.3125
    assert run.summary["hellaswag/acc_norm_stderr"] == 0.05
    assert "results.json" in run.artifacts[0].files

    # the key file: 0600 in a 0700 dir, owned by the job's user
    ciuser_uid = int(subprocess.run(["id", "-u", infra.ssh_user], capture_output=True, text=True).stdout)
    for path, mode in ((Path(key_file).parent, 0o700), (Path(key_file), 0o600)):
        info = path.stat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (mode, ciuser_uid), path

    # 3. an export from here, of the results fetched back (the key still only in the environment)
    fetched = tmp_path / "fetched" / invocation
    shutil.copytree(job_dir, fetched, ignore=shutil.ignore_patterns(".secrets", "wandb"))
    InvocationRecord(
        id=invocation,
        created="2026-11-22T01:00:00Z",
        mode="batch",
        profile="CI",
        executor="local",
        job_dir=str(fetched),
        tasks=[TaskEntry(t, d) for t, d in tasks],
        local_results_dir=str(fetched),
    ).save()
    result = CliRunner().invoke(app, ["export", invocation, "--to", "wandb"], env={"WANDB_MODE": "offline"})
    outputs.append(result.output)
    assert result.exit_code == 0, result.output
    assert len(offline_run_dirs(fetched)) == 1

    # 4. the canary is nowhere but in the key file
    ssh_log = Path(infra.ssh_log).read_bytes()[ssh_log_offset:].decode(errors="replace")
    outputs.append(ssh_log)
    for text in outputs:
        assert canary not in text
    ciuser_home = Path(infra.user_home)
    roots = [
        tmp_path,
        Path(remote_job_dir),
        Path(os.environ.get("XDG_STATE_HOME", home)),
        ciuser_home / ".local" / "share" / "wandb",
        ciuser_home / ".cache" / "wandb",
        ciuser_home / ".config" / "wandb",
        Path("/var/spool/slurmctld"),
        Path("/var/spool/slurmd"),
        Path("/var/log/slurm"),
        Path("/tmp"),
    ]
    hits = []
    searched = 0
    for path in _files([r for r in roots if r.exists()], since=started):
        if path == Path(key_file):
            continue
        searched += 1
        try:
            if canary.encode() in path.read_bytes():
                hits.append(str(path))
        except OSError:
            continue
    assert searched > 50  # the job dir, the offline runs, wandb's staging: many files were written
    assert hits == [], hits
    assert json.loads((fetched / "results.json").read_text())["invocation"] == invocation
