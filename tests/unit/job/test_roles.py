"""Deployments keyed by role: a judge deployed beside the model is a second deployment of the job, with its own
port (and published port file), identity, log and state; a third role is one registry entry; the job script
starts, checks and stops each (real processes, real HTTP)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.errors import ConfigError
from ckpteval.execution.backend import task_log
from ckpteval.execution.snapshot import LocalJobView, settle_tasks, take_snapshot
from ckpteval.job.build import Toolchain, build_plan
from ckpteval.job.plan import DeploymentPlan, Step
from ckpteval.job.roles import Role, register_role, role, roles, unregister_role
from ckpteval.job.script import render_job_script
from tests.unit.job.test_script import (
    GOLDEN,
    UPDATE,
    free_port,
    make_plan,
    run_job,
    stalling_date,
    state,
    write_job,
)

TOOLCHAIN = Toolchain(python="/venv/bin/python", evaluator="/venv/bin/nemo-evaluator", hook_dir="/hook")
JUDGE = ("judge=builtin",)


def _compile(tmp_path: Path, *overrides: str, tasks: tuple[str, ...] = ("mtbench",)):
    return compile_config(CompileRequest(configs=("tiny",), tasks=tasks, overrides=overrides, cwd=tmp_path))


def _plan(tmp_path: Path, *overrides: str):
    compiled = _compile(tmp_path, *overrides)
    return compiled, build_plan(
        compiled, invocation="i", job_dir=str(tmp_path / "job"), toolchain=TOOLCHAIN, launcher="processes"
    )


@pytest.fixture
def judge_checkpoint(tmp_path: Path) -> str:
    path = tmp_path / "judge-ckpt"
    path.mkdir()
    return str(path)


def test_a_builtin_judge_is_a_second_deployment_of_the_job(isolated_user: Path, judge_checkpoint: str) -> None:
    _, plan = _plan(isolated_user, *JUDGE, f"judge.checkpoint_path={judge_checkpoint}")
    assert list(plan.deployments) == ["model", "judge"]
    model, judge = plan.deployments["model"], plan.deployments["judge"]
    assert plan.deployment is model and judge.kind == "megatron/builtin"
    # each its own port, published port file, identity, and what it loaded
    assert (model.port, judge.port) == (8000, 8001)
    assert model.port_file.endswith("state/deployment_port") and judge.port_file.endswith("state/judge_port")
    assert model.identity and judge.identity and model.identity != judge.identity
    assert judge_checkpoint in judge.step.command and "--port 8001" in judge.step.command
    assert "state/judge_port" in judge.step.command and "state/judge_served_checkpoint.json" in judge.step.command
    assert "--publish-tokenizer" not in judge.step.command  # only the model's clients read a tokenizer
    # the task's harness is told the judge (not the model), on the port the judge publishes at run time
    [run] = plan.tasks[0].runs
    told = run.run_config["config"]["params"]["extra"]["judge"]
    assert (told["url"], told["model_id"]) == ("http://127.0.0.1:8001/v1", "judge")
    assert "config.params.extra.judge.url=http://127.0.0.1:${JUDGE_PORT}/v1" in run.step.command
    # and waits for it, then checks its identity, before its harness sends anything
    assert 'CKPTEVAL_JUDGE_URL="http://127.0.0.1:${JUDGE_PORT}/v1"' in run.step.command
    assert 'ckpteval_judge.py check "$CKPTEVAL_JUDGE_URL" judge && ' in run.step.command
    assert run.step.env["CKPTEVAL_JUDGE_IDENTITY"] == judge.identity
    script = render_job_script(plan)
    assert "starting the judge (megatron/builtin)" in script and "> logs/judge.log 2>&1 &" in script
    assert "JUDGE_PORT=$(cat" in script and "STOPS+=(stop_judge)" in script
    # the model's own lines are those of a job without a judge
    assert "> logs/deployment.log 2>&1 &" in script and "DEPLOY_PORT=$(cat" in script


def test_a_judge_deployment_is_refused_before_anything_when_it_cannot_run(
    isolated_user: Path, judge_checkpoint: str
) -> None:
    with pytest.raises(ConfigError, match="both 8000: each deployment of the job has a port of its own"):
        _compile(isolated_user, *JUDGE, f"judge.checkpoint_path={judge_checkpoint}", "judge.port=8000")
    with pytest.raises(ConfigError, match="The judge's checkpoint /nowhere/judge does not exist"):
        _compile(isolated_user, *JUDGE, "judge.checkpoint_path=/nowhere/judge")
    with pytest.raises(ConfigError, match="served by the builtin server for now"):
        _compile(isolated_user, *JUDGE, f"judge.checkpoint_path={judge_checkpoint}", "judge.backend=export-deploy")


@pytest.fixture
def reward_role() -> Iterator[Role]:
    """A third role (a reward endpoint) added through the registry alone: the model's checkpoint on its own port."""

    def section(config):
        return dataclasses.replace(config.deployment, port=8002, served_model_name="reward")

    added = register_role(Role(name="reward", section=section, stem="reward", var="REWARD"))
    try:
        yield added
    finally:
        unregister_role("reward")
    assert [r.name for r in roles()] == ["model", "judge"]


def test_a_third_role_is_one_registry_entry(isolated_user: Path, judge_checkpoint: str, reward_role: Role) -> None:
    _, plan = _plan(isolated_user, *JUDGE, f"judge.checkpoint_path={judge_checkpoint}")
    assert list(plan.deployments) == ["model", "judge", "reward"]
    reward = plan.deployments["reward"]
    assert reward.port == 8002 and reward.port_file.endswith("state/reward_port") and reward.identity
    script = render_job_script(plan)
    for line in ("starting the reward (megatron/builtin)", "> logs/reward.log 2>&1 &", "REWARD_PORT=$(cat"):
        assert line in script
    assert "STOPS+=(stop_reward)" in script
    # its log and state are read like the judge's
    record = SimpleNamespace(id="i", task=lambda name: None, task_names=["mtbench"])  # no task named so
    assert task_log(record, "reward") == "logs/reward.log"  # type: ignore[arg-type]
    assert task_log(record, "judge") == "logs/judge.log"  # type: ignore[arg-type]
    assert task_log(record, "deployment") == "logs/deployment.log"  # type: ignore[arg-type]
    job = isolated_user / "job"
    (job / "state").mkdir(parents=True)
    (job / "state" / "reward").write_text("ready\n")
    snapshot = take_snapshot(LocalJobView(job), [], None)
    assert snapshot.deployments == {"model": "", "reward": "ready"}
    assert settle_tasks(snapshot, active=False, state="cancelled").deployments["reward"] == "cancelled"


def _with_judge(plan, job_dir: Path, *, judge_port: int, reports: str, identity: str = "judge-id") -> object:
    """`plan` with a judge beside its model: the same health server, on its own port, reporting `reports`."""
    port_file = str(job_dir / "state" / "judge_port")
    judge = DeploymentPlan(
        kind="megatron/builtin",
        step=Step(
            command=f"exec {sys.executable} server.py {judge_port} {port_file}",
            env={"HITS": str(job_dir / "judge-hits.log"), "REPORTS": reports},
        ),
        health_url=f"http://127.0.0.1:{judge_port}/v1/health",
        readiness_timeout=30,
        port=judge_port,
        identity=identity,
        identity_url=f"http://127.0.0.1:{judge_port}/v1/health",
        port_file=port_file,
        role="judge",
    )
    return dataclasses.replace(plan, others=(judge,))


def test_the_job_starts_checks_and_stops_both_servers(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    port = free_port()
    # the task reaches the judge on the port the judge published (planned 0: it takes any free one), once it
    # answers (as a judged task's check waits for it)
    judge_url = "http://127.0.0.1:$JUDGE_PORT/v1/health"
    wait_then_ask = f'until curl -sf "{judge_url}" > /dev/null; do sleep 0.2; done; curl -sf "{judge_url}" > judged'
    plan = make_plan(job_dir, port=port, tasks=[("t1", wait_then_ask)])
    plan = _with_judge(plan, job_dir, judge_port=0, reports="judge-id")
    proc = run_job(write_job(tmp_path, plan))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert state(job_dir, "state/judge") == "ready" and state(job_dir, "state/judge_identity") == "judge-id"
    assert state(job_dir, "state/deployment") == "ready"
    judge_port = int(state(job_dir, "state/judge_port"))
    assert judge_port not in (0, port)
    assert json.loads((job_dir / "judged").read_text())["deployment"] == "judge-id"
    log = proc.stdout
    assert f"the judge holds port {judge_port}" in log and "stopping the judge" in log
    assert "judge healthy" in log and "(identity judge-id verified)" in log
    assert (job_dir / "judge-hits.log").read_text().count("/v1/health") >= 1


def test_the_judge_healthy_line_is_said_once_when_the_tasks_end_as_its_watcher_marks_it_ready(tmp_path: Path) -> None:
    """The judge's watcher, stopped between its mark and its line (made certain by a stalled clock): the line
    is still said, once, before the judge is stopped."""
    job_dir = tmp_path / "job"
    sees_mark = 'until [ "$(cat state/judge 2>/dev/null)" = ready ]; do sleep 0.05; done'
    plan = _with_judge(
        make_plan(job_dir, port=free_port(), tasks=[("t1", sees_mark)]), job_dir, judge_port=0, reports="judge-id"
    )
    proc = run_job(write_job(tmp_path, plan), PATH=stalling_date(tmp_path, "state/judge"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (job_dir / "stalled").exists()
    assert proc.stdout.count("judge healthy") == 1, proc.stdout
    assert proc.stdout.index("judge healthy") < proc.stdout.index("stopping the judge")
    assert state(job_dir, "state/judge") == "ready"


def test_a_judge_that_reports_another_identity_stops_the_job(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    plan = make_plan(job_dir, port=free_port(), tasks=[("t1", "sleep 30")])
    plan = _with_judge(plan, job_dir, judge_port=0, reports="someone-else")
    proc = run_job(write_job(tmp_path, plan))
    assert proc.returncode == 3
    assert state(job_dir, "state/judge") == "failed"
    log = proc.stdout + proc.stderr
    assert "answers for another deployment: it does not report this job's judge identity judge-id" in log
    assert not (job_dir / "state" / "judge_identity").exists()
    # the job stopped both servers and finished its stop: the model's was stopped, not failed, and nothing of
    # the job is left running (the model's watcher, left running, used to cut the stop short with its own signal)
    assert state(job_dir, "state/finished") == "3" and state(job_dir, "state/deployment") != "failed"
    time.sleep(2)  # the model's watcher, were it left, would look again within a second
    assert state(job_dir, "state/deployment") != "failed"
    left = subprocess.run(["pgrep", "-f", str(job_dir)], capture_output=True, text=True).stdout.split()
    assert left == []


def test_the_model_role_keeps_the_names_of_earlier_jobs() -> None:
    model = role("model")
    assert (model.state_file, model.port_file, model.identity_file, model.log, model.port_var) == (
        "state/deployment",
        "state/deployment_port",
        "state/deployment_identity",
        "logs/deployment.log",
        "DEPLOY_PORT",
    )
    assert model.served_file == "state/served_checkpoint.json"


@pytest.mark.parametrize("launcher", ["processes", "srun-containers"])
def test_golden_with_a_judge(launcher: str) -> None:
    """A job with a judge beside the model: on Slurm the judge's step runs on the node after the model's and is
    reached at that node's name; here, beside it on 127.0.0.1."""
    on_slurm = launcher == "srun-containers"
    plan = make_plan(Path("/jobs/abcd1234"), port=8000, tasks=[("mtbench", "echo judged")])
    judge = DeploymentPlan(
        kind="megatron/builtin",
        step=Step(command="exec python -m ckpteval.server serve --port 8001", node_offset=1 if on_slurm else 0),
        health_url="http://127.0.0.1:8001/v1/health",
        readiness_timeout=600,
        port=8001,
        identity="abcd1234-judge0123456",
        identity_url="http://127.0.0.1:8001/v1/health",
        port_file="/jobs/abcd1234/state/judge_port",
        role="judge",
        host_var="JUDGE_HOST" if on_slurm else None,
    )
    text = render_job_script(dataclasses.replace(plan, others=(judge,)), launcher=launcher)  # type: ignore[arg-type]
    golden = GOLDEN / f"job_judge_{launcher}.sh"
    portable = text.replace(sys.executable, "python")  # the model's step runs this venv's python
    if UPDATE:
        golden.write_text(portable)
    assert portable == golden.read_text()
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    if on_slurm:
        assert '--nodelist="$(step_nodes 1 1)"' in text and 'JUDGE_HOST="$(step_nodes 1 1)"' in text
        assert 'JUDGE_HEALTH_URL="http://${JUDGE_HOST}:${JUDGE_PORT}/v1/health"' in text


STANDIN = Path(__file__).resolve().parents[2] / "support" / "vllm_standin.py"


@pytest.fixture
def vllm_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`vllm` on PATH: the transformers stand-in with vLLM's command line and routes (tests/support)."""
    bin_dir = tmp_path / "standin-bin"
    bin_dir.mkdir()
    vllm = bin_dir / "vllm"
    vllm.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    vllm.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


def _hf_dir(root: Path) -> Path:
    """A directory the plan takes for a Hugging Face model (its config.json); nothing loads it."""
    path = root / "hf-judge"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def test_a_vllm_judge_is_a_second_deployment_of_the_job(isolated_user: Path, vllm_on_path: Path) -> None:
    hf = _hf_dir(isolated_user)
    compiled, plan = _plan(isolated_user, "judge=vllm", f"judge.checkpoint_path={hf}")
    assert list(plan.deployments) == ["model", "judge"]
    judge = plan.deployments["judge"]
    assert judge.kind == "vllm" and judge.port == 8001 and judge.port_file is None  # vLLM holds the port given
    assert judge.step.command.startswith(f"vllm serve {hf} ") and "--port 8001" in judge.step.command
    # its identity: a second served model name, which its /v1/models lists
    assert f"--served-model-name judge {judge.identity}" in judge.step.command
    assert (judge.health_url, judge.identity_url) == ("http://127.0.0.1:8001/health", "http://127.0.0.1:8001/v1/models")
    [run] = plan.tasks[0].runs
    told = run.run_config["config"]["params"]["extra"]["judge"]
    assert (told["url"], told["model_id"]) == ("http://127.0.0.1:8001/v1", "judge")
    # the task checks it in /v1/models before its first request; vLLM names no deployment on its answers
    assert run.step.env["CKPTEVAL_JUDGE_IDENTITY"] == judge.identity
    assert (run.step.env["CKPTEVAL_JUDGE_IDENTITY_ROUTE"], run.step.env["CKPTEVAL_JUDGE_ANSWERS_NAMED"]) == (
        "models",
        "0",
    )
    assert "starting the judge (vllm)" in render_job_script(plan)
    from ckpteval.cli.preview import deployed_judge_row

    assert deployed_judge_row(compiled) == f"judge: {hf} (vLLM, a second server)"
    # the builtin judge names the deployment on every answer: the task checks each one
    _, builtin = _plan(isolated_user, *JUDGE, f"judge.checkpoint_path={hf}")
    env = builtin.tasks[0].runs[0].step.env
    assert (env["CKPTEVAL_JUDGE_IDENTITY_ROUTE"], env["CKPTEVAL_JUDGE_ANSWERS_NAMED"]) == ("health", "1")


def test_a_judge_on_a_node_of_its_own_is_reached_at_its_node_even_without_a_published_port() -> None:
    on_its_node = DeploymentPlan(
        kind="vllm", step=None, health_url=None, readiness_timeout=60, port=8001, role="judge", host_var="JUDGE_HOST"
    )
    assert on_its_node.on_published_port("http://127.0.0.1:8001/v1") == "http://${JUDGE_HOST}:8001/v1"
    beside = dataclasses.replace(on_its_node, host_var=None)
    assert beside.on_published_port("http://127.0.0.1:8001/v1") == "http://127.0.0.1:8001/v1"


def test_a_vllm_judge_is_refused_before_anything_when_it_cannot_run(
    isolated_user: Path, monkeypatch: pytest.MonkeyPatch, judge_checkpoint: str
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no vllm here, and no containers
    hf = _hf_dir(isolated_user)
    with pytest.raises(ConfigError, match="this machine runs no containers and has no `vllm`"):
        _compile(isolated_user, "judge=vllm", f"judge.checkpoint_path={hf}")
    bin_dir = isolated_user / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text("#!/bin/sh\n")
    (bin_dir / "vllm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(ConfigError, match="is not a Hugging Face directory"):
        _compile(isolated_user, "judge=vllm", f"judge.checkpoint_path={judge_checkpoint}")
    with pytest.raises(ConfigError, match="both 8000"):
        _compile(isolated_user, "judge=vllm", f"judge.checkpoint_path={hf}", "judge.port=8000")


@pytest.fixture(scope="module")
def tiny_export(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint's Hugging Face export (what the vLLM stand-in serves)."""
    from ckpteval.hfexport.write import export_checkpoint

    return Path(export_checkpoint(tiny_checkpoint, tmp_path_factory.mktemp("judge-export") / "hf").output)


def test_the_job_starts_checks_and_stops_a_vllm_judge(tmp_path: Path, vllm_on_path: Path, tiny_export: Path) -> None:
    """The job's script with vLLM (the stand-in) as its judge: started, its identity found in its /v1/models,
    the task's judge check (the harness hook, told as build tells it) passes, the task's judge request is
    answered by the judge and none reaches the model; the judge is stopped at the end."""
    from ckpteval.job.build import _deployed_judge_env

    job_dir = tmp_path / "job"
    judge_port = free_port()
    hook = Path(__file__).resolve().parents[3] / "src" / "ckpteval" / "tasks" / "harness_hook" / "ckpteval_judge.py"
    judge = DeploymentPlan(
        kind="vllm",
        step=Step(
            command=f"exec vllm serve {tiny_export} --port {judge_port} --served-model-name judge judge-id",
            env={"VLLM_STANDIN_LOG": str(job_dir / "judge-answers.json")},
        ),
        health_url=f"http://127.0.0.1:{judge_port}/health",
        readiness_timeout=120,
        port=judge_port,
        identity="judge-id",
        identity_url=f"http://127.0.0.1:{judge_port}/v1/models",
        role="judge",
    )
    url = f"http://127.0.0.1:{judge_port}/v1"
    ask = (
        f"{sys.executable} {hook} check {url} judge > judge-check.txt 2>&1 && "
        f"curl -sf {url}/completions -H 'Content-Type: application/json' "
        """-d '{"model": "judge", "prompt": "Rate this answer:", "max_tokens": 2}' > judged.json"""
    )
    plan = make_plan(job_dir, port=free_port(), tasks=[("t1", ask)])
    task = plan.tasks[0]
    runs = tuple(
        dataclasses.replace(r, step=dataclasses.replace(r.step, env={**r.step.env, **_deployed_judge_env(judge)}))
        for r in task.runs
    )
    plan = dataclasses.replace(plan, others=(judge,), tasks=(dataclasses.replace(task, runs=runs),))
    proc = run_job(write_job(tmp_path, plan))
    log = proc.stdout
    assert proc.returncode == 0, log + proc.stderr + (job_dir / "logs" / "judge.log").read_text()
    assert f"judge healthy: http://127.0.0.1:{judge_port}/health (identity judge-id verified)" in log
    assert state(job_dir, "state/judge") == "ready" and state(job_dir, "state/judge_identity") == "judge-id"
    assert "ckpteval: judge judge at" in (job_dir / "judge-check.txt").read_text()  # the hook's check passed
    assert json.loads((job_dir / "judged.json").read_text())["model"] == "judge"
    # counted at each server: the judge answered the one completion; the model only its health checks
    assert json.loads((job_dir / "judge-answers.json").read_text())["answered"] == 1
    assert set((job_dir / "hits.log").read_text().split()) == {"/v1/health"}
    assert "stopping the judge" in log
