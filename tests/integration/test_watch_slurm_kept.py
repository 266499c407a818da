"""`evaluate watch` on the real test cluster keeps one Slurm job across a training's checkpoints.

Four saves of one training run (different weights, written by megatron-core: tests/support/corpus/
training_run.py) are watched from this machine over SSH: the watcher submits one kept job (the builtin server,
its load directory on the cluster's filesystem) and runs each checkpoint's job script as a step of it, the
server loading the checkpoint in place. Each checkpoint is its own invocation: its results.json names its own
checkpoint (as the server reported it, verified), its GPU-hours are its step's (sacct), and `status`/`logs`
work as for any Slurm invocation. Today's watch (`--fresh-deployments`: one Slurm job per checkpoint) runs the
same four saves right after, as the baseline: the same scores, checkpoint by checkpoint; the wall times per
checkpoint, their ratio and the start-up share are printed with the load average (benchmarks/watch.md).
That one is long tier (~17 min at load ~20); the kept job that dies (~40 s) runs by default.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.cluster.slurm import elapsed_seconds
from ckpteval.execution.slurm_kept import kept_job_name
from tests.integration.conftest import REPO, Infra
from tests.integration.slurm_jobs import free_port
from tests.support.corpus.training_run import build_training_run

pytestmark = pytest.mark.slurm
runner = CliRunner()
TASK = "adlr_humaneval_greedy"
PARAMS = "evaluation.nemo_evaluator_config.config.params"


def cli(*argv: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(argv))
    assert "Traceback" not in result.output, result.output
    return result


def _saves(root: Path, infra: Infra) -> Path:
    build_training_run(root, steps=4)
    subprocess.run(["chown", "-R", f"{infra.ssh_user}:", str(root.parents[1])], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(root.parents[1])], check=True)
    return root


def _invocations(save_dir: Path) -> dict[int, dict]:
    """iteration -> (record, results.json) of the invocations that evaluated `save_dir`'s saves."""
    from ckpteval.invocation.record import records_dir

    out = {}
    for path in records_dir().glob("*/record.json"):
        record = json.loads(path.read_text())
        watch = record.get("watch") or {}
        if str(watch.get("iter_dir", "")).startswith(str(save_dir)):
            results = json.loads((Path(record["job_dir"]) / "results.json").read_text())
            out[watch["iteration"]] = {"record": record, "results": results}
    return out


def _sacct(*args: str) -> list[list[str]]:
    out = subprocess.run(["sacct", "-a", "-n", "-P", *args], capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]


def _answers(job_dir: str) -> list[tuple[str, list[str], str]]:
    """What the server answered the task, request by request: (request key, completions, the checkpoint content
    that answered), from the job's response cache."""
    found = []
    for path in Path(job_dir).glob("tasks/*/output/cache/ckpteval_responses.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            texts = [c.get("text") or (c.get("message") or {}).get("content") for c in entry["response"]["choices"]]
            found.append((entry["key"], texts, entry["checkpoint"]))
    return sorted(found)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(2400)
def test_watch_on_slurm_keeps_one_job_and_scores_as_fresh_jobs(
    write_env_toml, infra: Infra, remote_job_dir: str, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "400")
    root = Path(remote_job_dir)
    kept_dir = _saves(root / "kept" / "checkpoints", infra)
    fresh_dir = Path(shutil.copytree(kept_dir, root / "fresh" / "checkpoints"))
    subprocess.run(["chown", "-R", f"{infra.ssh_user}:", str(root / "fresh")], check=True)
    venv_bin = REPO / ".venv" / "bin"
    env = write_env_toml(
        "CI",
        python=str(venv_bin / "python"),
        nodes=1,
        time="00:15:00",
        env_vars={
            "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
        },
    )

    def watch(save_dir: Path, *extra: str):  # type: ignore[no-untyped-def]
        return [
            "watch", str(save_dir), "-c", "tiny", "--run", "CI", "--env-file", str(env), "-t", TASK,
            "deployment.backend=builtin", f"deployment.port={free_port()}",
            f"{PARAMS}.limit_samples=2", f"{PARAMS}.max_new_tokens=16",
            "--every", "2", "--follow-every", "2", *extra,
        ]  # fmt: skip

    dry = cli(*watch(kept_dir), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "in one kept Slurm job, each checkpoint a step of it" in dry.output
    assert "--load-into" in dry.output  # the job of the first loads into the kept server
    run = dry.output.split("watch run ", 1)[1].split(":", 1)[0].strip()
    fresh_dry = cli(*watch(fresh_dir, "--fresh-deployments"), "--dry-run")
    assert "a fresh deployment per checkpoint: --fresh-deployments" in fresh_dry.output

    try:
        started = time.monotonic()
        kept = cli(*watch(kept_dir), "--once")
        kept_wall = time.monotonic() - started
        assert kept.exit_code == 0, kept.output[-6000:]
        assert "submitted kept Slurm job" in kept.output, kept.output[-3000:]
        started = time.monotonic()
        fresh = cli(*watch(fresh_dir, "--fresh-deployments", "--max-pending", "1"), "--once")
        fresh_wall = time.monotonic() - started
        assert fresh.exit_code == 0, fresh.output[-6000:]
    finally:
        subprocess.run(["scancel", "--name", kept_job_name(run)], check=False)

    # one evaluation job for the four checkpoints, cancelled when the watcher ended
    kept_jobs = {f[0] for f in _sacct("-X", "--name", kept_job_name(run), "-o", "JobID,State")}
    assert len(kept_jobs) == 1, kept_jobs
    (kept_job,) = kept_jobs
    assert subprocess.run(["squeue", "-h", "-j", kept_job], capture_output=True, text=True).stdout.strip() == ""
    steps = {f[1]: f for f in _sacct("-j", kept_job, "-o", "JobID,JobName,Elapsed,State")}

    in_place, fresh_runs = _invocations(kept_dir), _invocations(fresh_dir)
    assert sorted(in_place) == sorted(fresh_runs) == [1, 2, 3, 4]
    whole = _sacct("-X", "-j", kept_job, "-o", "JobID,Elapsed")[0]
    kept_total = elapsed_seconds(whole[1]) or 0.0
    per_kept = [in_place[i]["results"]["usage"]["wall_seconds"] for i in (1, 2, 3, 4)]
    per_fresh = [fresh_runs[i]["results"]["usage"]["wall_seconds"] for i in (1, 2, 3, 4)]
    startup_kept = [in_place[i]["results"]["usage"]["phases"].get("startup") for i in (1, 2, 3, 4)]
    startup_fresh = [fresh_runs[i]["results"]["usage"]["phases"].get("startup") for i in (1, 2, 3, 4)]
    load = os.getloadavg()
    print(
        f"\nper checkpoint (sacct elapsed), kept steps: {per_kept}, fresh jobs: {per_fresh}; "
        f"start-up kept: {startup_kept}, fresh: {startup_fresh}; kept job {kept_job} in all {kept_total:.0f} s; "
        f"watcher wall kept {kept_wall:.0f} s, fresh {fresh_wall:.0f} s (ratio {kept_wall / fresh_wall:.2f}); "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    print("\n".join(line for line in kept.output.splitlines() if "kept" in line or "deployment" in line))
    assert sum(per_kept) <= kept_total  # the steps' shares, not the job's time four times
    contents = set()
    for iteration in (1, 2, 3, 4):
        a, b = in_place[iteration]["results"], fresh_runs[iteration]["results"]
        invocation = in_place[iteration]["record"]["id"]
        assert a["status"] == b["status"] == "succeeded"
        served, planned = a["provenance"]["checkpoint"], b["provenance"]["checkpoint"]
        # each invocation names the checkpoint it was scored on, as the server reported it, verified
        assert served["source"] == "server" and served["verified"] and not served.get("mismatch")
        assert served["path"].endswith(f"iter_000000{iteration}") and served["in_place"] is True
        assert served["content"]["sha256"] == planned["content"]["sha256"]
        contents.add(served["content"]["sha256"])
        assert a["tasks"][TASK]["metrics"] == b["tasks"][TASK]["metrics"]  # scored alike
        kept_answers = _answers(in_place[iteration]["record"]["job_dir"])
        assert kept_answers and kept_answers == _answers(fresh_runs[iteration]["record"]["job_dir"])
        assert {checkpoint for _key, _texts, checkpoint in kept_answers} == {served["content"]["sha256"]}
        # its GPU-hours are its own step's (sacct), not the kept job's whole time
        step = steps[f"ckpteval-{invocation}"]
        assert step[0].startswith(kept_job + ".") and step[3] == "COMPLETED"
        assert a["usage"]["source"] == "sacct" and a["usage"]["deployment"] == "kept"
        assert a["usage"]["wall_seconds"] == elapsed_seconds(step[2])
        assert b["usage"]["deployment"] == "own"
        # status, logs and results of the invocation, as of any Slurm invocation
        shown = cli("status", invocation, "--json")
        assert shown.exit_code == 0, shown.output
        (status,) = json.loads(shown.stdout)
        assert status["state"] == "succeeded" and status["slurm_step"] == step[0], status
        logs = cli("logs", invocation)
        assert logs.exit_code == 0 and "deployment healthy" in logs.output, logs.output[-2000:]
        assert "Loaded in place" in cli("logs", invocation, "--source", "deployment").output
    assert len(contents) == 4
    print(kept.output[-4000:])


@pytest.mark.timeout(600)
def test_a_kept_job_that_dies_is_replaced_for_the_next_checkpoint_and_stop_cancels_it(
    write_env_toml, infra: Infra, remote_job_dir: str, tiny_checkpoint: str
):
    """The kept job is cancelled behind the watcher's back (a node failure, a user's scancel): the next
    checkpoint gets a new kept job (said), not a wait on the dead one; a job script handed to the dead one is
    refused at once; stopping cancels the kept job."""
    from ckpteval.errors import DeploymentError
    from ckpteval.execution.slurm import SlurmBackend
    from ckpteval.watch import submit
    from ckpteval.watch.run import resolve_profile
    from ckpteval.watch.state import WatchSpec, run_name
    from tests.integration.test_watch_ssh import _write_saves

    save_dir = Path(remote_job_dir) / "run7" / "checkpoints"
    _write_saves(save_dir, infra, complete=[100, 200], half=[], like=Path(tiny_checkpoint))
    venv_bin = REPO / ".venv" / "bin"
    env = write_env_toml("CI", python=str(venv_bin / "python"), nodes=1, env_vars={"HF_HUB_OFFLINE": "1"})
    spec = WatchSpec(
        save_dir=str(save_dir), configs=["tiny"], profile="CI", tasks=[TASK], overrides=[], env_file=str(env)
    )
    run = run_name(spec.save_dir, spec.profile)
    notes: list[str] = []
    kept = SlurmBackend().kept_job(
        run,
        resolve_profile(spec),
        lambda i, d: submit.compile_evaluation(spec, i, d, run=run),
        on_note=lambda m, _i: notes.append(m),
    )
    try:
        first = kept.place(100, str(save_dir / "iter_0000100"))
        assert first.load_into and "submitted kept Slurm job" in first.note, first
        job = (Path(first.load_into) / "slurm_job").read_text().strip()
        subprocess.run(["scancel", job], check=True)
        started = time.monotonic()
        while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
            assert time.monotonic() - started < 60
            time.sleep(1)
        # a job script handed to the dead kept job is refused at once (the watcher then retries it)
        iter_dir = str(save_dir / "iter_0000200")
        compiled = submit.compile_evaluation(spec, 200, iter_dir, run=run, load_into=first.load_into)
        from ckpteval.api import submit as submit_invocation

        with pytest.raises(DeploymentError, match="does not run"):
            submit_invocation(compiled)
        second = kept.place(200, str(save_dir / "iter_0000200"))
        assert f"kept Slurm job {job} no longer runs: a new kept job" in second.note, second
        assert second.load_into and second.load_into != first.load_into
        replacement = (Path(second.load_into) / "slurm_job").read_text().strip()
        assert replacement != job
    finally:
        kept.stop()
    assert subprocess.run(["squeue", "-h", "--name", kept_job_name(run)], capture_output=True, text=True).stdout == ""
    assert any(n.startswith(f"kept Slurm job {replacement} stopped") for n in notes), notes
