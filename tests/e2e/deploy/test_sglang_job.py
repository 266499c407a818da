"""SGLang as the deployment of a Megatron checkpoint, end to end on this machine: `evaluate -c tiny
deployment=sglang run.model=<the tiny Megatron checkpoint>` exports the checkpoint (the job's first step), serves
the export with SGLang (the stand-in, tests/support/sglang_standin.py, started by the job as `python -m
sglang.launch_server`), checks that the endpoint reports the job's identity (SGLang's weight version) and scores;
the scores are the builtin server's on the same checkpoint. Another SGLang already on the port (another export,
another weight version) is refused by the identity check before any request. And (long tier) `evaluate watch`
keeps one SGLang across a training run's saves, loading each one's export in place, scoring as fresh
deployments do."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy_support import free_port
from tests.support.sglang_standin import install, start

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]

EVALUATE = [sys.executable, "-m", "ckpteval.cli"]
PARAMS = "evaluation.nemo_evaluator_config.config.params"
LIMIT = [f"{PARAMS}.limit_samples=4", f"{PARAMS}.parallelism=2"]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ckpteval.server.prepare import prepare_checkpoint

    return prepare_checkpoint("tiny", tmp_path_factory.mktemp("sglang-job") / "tiny")


@pytest.fixture
def env(isolated_user: Path, tmp_path: Path) -> dict[str, str]:
    """This machine with SGLang installed (the stand-in, as the package `sglang` on PYTHONPATH)."""
    shim = install(tmp_path / "sglang-shim")
    return {**os.environ, "PYTHONPATH": str(shim), "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _evaluate(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVALUATE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)


def _results(cwd: Path, proc: subprocess.CompletedProcess[str]) -> tuple[dict, Path]:
    invocation = re.search(r"invocation\s+([0-9a-f]{8})", proc.stdout).group(1)  # type: ignore[union-attr]
    job_dir = cwd / "results" / invocation
    return json.loads((job_dir / "results.json").read_text()), job_dir


def test_sglang_on_a_megatron_checkpoint_exports_serves_is_verified_and_scores_as_the_builtin_server(
    tiny_checkpoint: Path, isolated_user: Path, env: dict[str, str]
) -> None:
    common = ["-c", "tiny", "-t", "hellaswag", f"run.model={tiny_checkpoint}", *LIMIT]
    sglang = _evaluate(isolated_user, env, *common, "deployment=sglang", f"deployment.port={free_port()}")
    assert sglang.returncode == 0, sglang.stdout[-4000:] + sglang.stderr[-4000:]
    builtin = _evaluate(isolated_user, env, *common)
    assert builtin.returncode == 0, builtin.stdout[-4000:] + builtin.stderr[-4000:]

    ours, job_dir = _results(isolated_user, sglang)
    theirs, _ = _results(isolated_user, builtin)
    assert ours["status"] == theirs["status"] == "succeeded"
    assert ours["tasks"]["hellaswag"]["metrics"] == theirs["tasks"]["hellaswag"]["metrics"]
    # the export was served (the job's first step), by SGLang, and the job verified it was its own
    export = json.loads((job_dir / "state" / "hf_export.json").read_text())
    assert export["kind"] in ("exported", "reused") and export["served"] == str(Path(export["served"]))
    log = (job_dir / "logs" / "job.log").read_text()
    identity = (job_dir / "state" / "deployment_identity").read_text().strip()
    assert f"(identity {identity} verified)" in log
    deployment_log = (job_dir / "logs" / "deployment.log").read_text()
    assert "The server is fired up and ready to roll!" in deployment_log
    assert f"weight_version={identity!r}" in deployment_log


def test_another_sglang_on_the_port_is_refused_by_the_identity_check(
    tiny_checkpoint: Path, isolated_user: Path, env: dict[str, str], tmp_path: Path
) -> None:
    from ckpteval.hfexport.write import export_checkpoint

    other = export_checkpoint(tiny_checkpoint, tmp_path / "other-export").output
    squatter, url = start(other, tmp_path / "squatter", weight_version="someone-elses-job")
    try:
        port = url.rsplit(":", 1)[1]
        proc = _evaluate(
            isolated_user, env, "-c", "tiny", "-t", "hellaswag", f"run.model={tiny_checkpoint}", *LIMIT,
            "deployment=sglang", f"deployment.port={port}",
        )  # fmt: skip
    finally:
        squatter.terminate()
        squatter.wait(timeout=30)
    assert proc.returncode != 0
    invocation = re.search(r"invocation\s+([0-9a-f]{8})", proc.stdout).group(1)  # type: ignore[union-attr]
    log = (isolated_user / "results" / invocation / "logs" / "job.log").read_text()
    assert "answers for another deployment" in log and "/get_model_info" in log, log[-3000:]
    assert "Traceback" not in proc.stdout


@pytest.mark.long
def test_watch_keeps_one_sglang_and_loads_each_save_s_export_in_place(
    isolated_user: Path, env: dict[str, str], tmp_path: Path
) -> None:
    import shutil

    from tests.support.corpus.training_run import build_training_run

    kept_dir = build_training_run(tmp_path / "kept" / "checkpoints", steps=3)
    fresh_dir = Path(shutil.copytree(kept_dir, tmp_path / "fresh" / "checkpoints"))
    state_dir = Path(os.environ["XDG_STATE_HOME"]) / "ckpteval"

    def watch(save_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return _evaluate(
            isolated_user, env, "watch", str(save_dir), "-c", "tiny", "-t", "hellaswag", "--once", "--every", "1",
            "deployment=sglang", *extra, *LIMIT,
        )  # fmt: skip

    kept = watch(kept_dir)
    assert kept.returncode == 0, kept.stdout[-4000:] + kept.stderr[-4000:]
    assert "one deployment kept across checkpoints" in kept.stdout and "started the kept deployment" in kept.stdout
    fresh = watch(fresh_dir, "--fresh-deployments")
    assert fresh.returncode == 0, fresh.stdout[-4000:] + fresh.stderr[-4000:]

    def invocations(save_dir: Path) -> dict[int, tuple[dict, Path]]:
        out = {}
        for path in (state_dir / "invocations").glob("*/record.json"):
            record = json.loads(path.read_text())
            watched = record.get("watch") or {}
            if str(watched.get("iter_dir", "")).startswith(str(save_dir)):
                job_dir = Path(record["job_dir"])
                out[watched["iteration"]] = (json.loads((job_dir / "results.json").read_text()), job_dir)
        return out

    in_place, fresh_runs = invocations(kept_dir), invocations(fresh_dir)
    assert sorted(in_place) == sorted(fresh_runs) == [1, 2, 3]
    for iteration in (1, 2, 3):
        (a, job_dir), (b, _) = in_place[iteration], fresh_runs[iteration]
        assert a["status"] == b["status"] == "succeeded"
        assert a["tasks"]["hellaswag"]["metrics"] == b["tasks"]["hellaswag"]["metrics"]
        deployment_log = (job_dir / "logs" / "deployment.log").read_text()
        assert "Loaded in place (Succeeded to update model weights." in deployment_log, deployment_log
