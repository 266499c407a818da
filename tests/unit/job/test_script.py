"""The job script: golden files for its text, and real runs of it (real processes, real HTTP) for its
behaviour: deploy once, health wait with timeout, per-task states, resume, cleanup on every exit."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ckpteval.job.plan import DeploymentPlan, JobPlan, RequestGroups, Step, TaskPlan, TaskRun
from ckpteval.job.script import render_job_script
from ckpteval.tasks.repeats import run_layouts
from tests.support.waiting import wait_until

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("CKPTEVAL_UPDATE_GOLDEN") == "1"

HEALTH_SERVER = (
    "import http.server, json, sys, os, time\n"
    "open('server.pid', 'w').write(str(os.getpid()))\n"
    "time.sleep(float(os.environ.get('DELAY', '0')))\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        open(os.environ['HITS'], 'a').write(self.path + '\\n')\n"
    "        body = json.dumps({'status': 'healthy', 'deployment': os.environ.get('REPORTS', '')}).encode()\n"
    "        self.send_response(200 if self.path == '/v1/health' else 404); self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "    def log_message(self, *a): pass\n"
    "try:\n"
    "    server = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H)\n"
    "except OSError:  # like the builtin server's --port-fallback: a port the kernel assigns\n"
    "    if 'fallback' not in sys.argv: raise\n"
    "    server = http.server.HTTPServer(('127.0.0.1', 0), H)\n"
    "if len(sys.argv) > 2:  # like the builtin server's --port-file: the port it holds, once it holds it\n"
    "    open(sys.argv[2] + '.tmp', 'w').write(str(server.server_address[1]))\n"
    "    os.replace(sys.argv[2] + '.tmp', sys.argv[2])\n"
    "server.serve_forever()\n"
)


# what the harness hook does before a client's first request (ckpteval_wait_ready), in shell
CLIENT_WAITS = (
    'until curl -sf -o /dev/null "$CKPTEVAL_DEPLOYMENT_HEALTH"; do sleep 0.2; done; '
    'if [ -n "${CKPTEVAL_DEPLOYMENT_IDENTITY:-}" ]; then '
    'curl -s "$CKPTEVAL_DEPLOYMENT_IDENTITY_URL" | grep -qF "$CKPTEVAL_DEPLOYMENT_IDENTITY" '
    '|| { echo "refusing: $CKPTEVAL_DEPLOYMENT_IDENTITY_URL answers for another deployment" >&2; exit 3; }; fi; '
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_plan(
    job_dir: Path,
    *,
    port: int,
    tasks: list[tuple[str, str]],
    deploy_cmd: str | None = None,
    timeout: int = 30,
    repeats: int = 0,
    parallel: int = 1,
    waits: bool = True,
) -> JobPlan:
    """A job whose task clients run `tasks`' commands; like the real client (the harness hook), each first
    waits for the deployment's health URL the job gives it (`waits`)."""
    step = Step(
        command=deploy_cmd or f"exec {sys.executable} server.py {port}", env={"HITS": str(job_dir / "hits.log")}
    )
    deployment = DeploymentPlan(
        kind="megatron/builtin",
        step=step,
        health_url=f"http://127.0.0.1:{port}/v1/health",
        readiness_timeout=timeout,
        port=port,
    )
    plans = tuple(
        TaskPlan(
            name=name,
            dir_name=name,
            runs=tuple(
                TaskRun(
                    run_config={},
                    step=Step(
                        command=(CLIENT_WAITS + cmd) if waits else cmd,
                        env={"TASK": name} if layout.repeat is None else {"TASK": name, "REPEAT": str(layout.repeat)},
                    ),
                    layout=layout,
                )
                for layout in run_layouts(repeats)
            ),
            endpoint_url=f"http://127.0.0.1:{port}/v1/completions/",
            repeats=repeats,
        )
        for name, cmd in tasks
    )
    return JobPlan(
        invocation="abcd1234",
        job_dir=str(job_dir),
        deployment=deployment,
        tasks=plans,
        env={"HF_HUB_OFFLINE": "1"},
        max_parallel_tasks=parallel,
    )


def write_job(tmp_path: Path, plan: JobPlan) -> Path:
    job_dir = Path(plan.job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "server.py").write_text(HEALTH_SERVER)
    for t in plan.tasks:
        (job_dir / t.dir).mkdir(parents=True, exist_ok=True)
    script = job_dir / "job.sh"
    script.write_text(render_job_script(plan))
    return script


def run_job(script: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def state(job_dir: Path, rel: str) -> str:
    return (job_dir / rel).read_text().strip()


def pid_written(path: Path) -> bool:
    """Whether a task has written its process id into `path` (not merely created the file)."""
    return path.is_file() and path.read_text().strip().isdigit()


def alive(pid_file_text: str) -> bool:
    """Whether the process still runs (a zombie does not: it has exited, and a task client's zombie may
    wait a moment for the system's reaper once the job shell that started it in the background is gone)."""
    try:
        os.kill(int(pid_file_text), 0)
    except (ProcessLookupError, ValueError):
        return False
    try:
        stat = Path(f"/proc/{int(pid_file_text)}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


@pytest.mark.parametrize("launcher", ["processes", "srun-containers"])
def test_golden(launcher: str):
    plan = make_plan(
        Path("/jobs/abcd1234"),
        port=8000,
        deploy_cmd="exec python3 -m ckpteval.server serve --port 8000",
        tasks=[
            ("adlr_mmlu", "nemo-evaluator run_eval --run_config tasks/adlr_mmlu/run_config.yml"),
            ("hellaswag", "nemo-evaluator run_eval --run_config tasks/hellaswag/run_config.yml"),
        ],
        parallel=2,
        waits=False,
    )
    # adlr_mmlu generates, hellaswag scores: a probe decides whether they take turns (here), or they do
    # because the endpoint is known to mix settings (Export-Deploy 0.5+, the Slurm case)
    groups = RequestGroups(
        groups=((0,), (1,)),
        words=("adlr_mmlu's generations (temperature 0.0, its stop words)", "log-likelihood (echo, logprobs)"),
        probe="python3 /jobs/abcd1234/hook/ckpteval_settings_probe.py --model m --out /jobs/abcd1234/state/p.json",
    )
    plan = replace(plan, requests=groups)
    if launcher == "srun-containers":
        plan = JobPlan(
            invocation=plan.invocation,
            job_dir=plan.job_dir,
            env=plan.env,
            max_parallel_tasks=plan.max_parallel_tasks,
            requests=replace(groups, known_mixing="deploy_ray.py takes --batch_wait_timeout_s (Export-Deploy 0.5+)"),
            tasks=tuple(
                TaskPlan(
                    name=t.name,
                    dir_name=t.dir_name,
                    endpoint_url=t.endpoint_url,
                    runs=(
                        TaskRun(
                            run_config={},
                            step=Step(command=t.runs[0].step.command, image="/c/eval.sqsh", mounts=("/ckpt:/ckpt:ro",)),
                        ),
                    ),
                )
                for t in plan.tasks
            ),
            deployment=DeploymentPlan(
                kind="megatron/export-deploy",
                health_url=plan.deployment.health_url,
                readiness_timeout=600,
                port=8000,
                step=Step(
                    command="python deploy.py --port 8000",
                    image="/c/nemo.sqsh",
                    mounts=("/ckpt:/ckpt:ro",),
                    nodes=1,
                    ntasks_per_node=1,
                ),
            ),
        )
    else:  # the builtin server: it publishes the port it holds and reports the job's identity
        plan = replace(
            plan,
            deployment=replace(
                plan.deployment,
                identity="abcd1234-0123456789ab",
                identity_url=plan.deployment.health_url,
                port_file="/jobs/abcd1234/state/deployment_port",
            ),
        )
    text = render_job_script(plan, launcher=launcher)  # type: ignore[arg-type]
    golden = GOLDEN / f"job_{launcher}.sh"
    if UPDATE:
        golden.write_text(text)
    assert text == golden.read_text()
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_golden_repeats():
    plan = make_plan(
        Path("/jobs/abcd1234"),
        port=8000,
        deploy_cmd="exec python3 -m ckpteval.server serve --port 8000",
        tasks=[("gsm8k", "nemo-evaluator run_eval --run_config tasks/gsm8k/run_config-rs$REPEAT.yml")],
        repeats=2,
        waits=False,
    )
    text = render_job_script(plan)
    golden = GOLDEN / "job_repeats.sh"
    if UPDATE:
        golden.write_text(text)
    assert text == golden.read_text()
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_repeats_resume_at_the_first_unfinished_repeat(tmp_path: Path):
    port = free_port()
    # repeat 1 fails until the file `ok` exists; every run appends its repeat index to ran.txt
    cmd = 'echo "$REPEAT" >> ran.txt; if [ "$REPEAT" = 1 ] && [ ! -f ok ]; then exit 5; fi'
    plan = make_plan(tmp_path / "job", port=port, tasks=[("g", cmd), ("h", "true")], repeats=3)
    script = write_job(tmp_path, plan)
    job = Path(plan.job_dir)
    first = run_job(script)
    assert first.returncode == 1, first.stdout
    assert (job / "ran.txt").read_text().split() == ["0", "1"]  # the failing repeat stops the task
    assert state(job, "tasks/g/state") == "failed 5"
    assert "last lines of tasks/g/client-rs1.log" in first.stdout
    assert (job / "tasks/g/output-rs0/.done").exists() and not (job / "tasks/g/.done").exists()
    assert state(job, "tasks/h/state") == "succeeded"  # other tasks still run

    (job / "ok").touch()
    second = run_job(script)
    assert second.returncode == 0, second.stdout
    assert (job / "ran.txt").read_text().split() == ["0", "1", "1", "2"]  # repeat 0 was not run again
    assert state(job, "tasks/g/state") == "succeeded"
    assert all((job / "tasks/g" / f"output-rs{i}/.done").exists() for i in range(3))
    assert "repeat 2 of 3 (seed 2)" in second.stdout


def test_runs_every_task_against_one_deployment(tmp_path: Path):
    port = free_port()
    plan = make_plan(
        tmp_path / "job",
        port=port,
        tasks=[
            ("a", f"curl -sf http://127.0.0.1:{port}/v1/health && echo ran-$TASK > out-a.txt"),
            ("b", "exit 7"),
            ("c", "sleep 1; echo ran-$TASK-$HF_HUB_OFFLINE > out.txt"),
        ],
        parallel=3,
    )
    job = Path(plan.job_dir)
    proc = run_job(write_job(tmp_path, plan))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert state(job, "tasks/a/state") == "succeeded"
    assert state(job, "tasks/b/state") == "failed 7"
    assert state(job, "tasks/c/state") == "succeeded"  # a failure does not stop the tasks beside it
    assert (job / "out-a.txt").read_text().strip() == "ran-a"
    assert state(job, "state/finished") == "1"
    assert state(job, "state/deployment") == "ready"
    assert proc.stdout.count("deployment healthy") == 1
    assert (job / "out.txt").read_text().strip() == "ran-c-1"
    assert "b: failed (exit 7)" in proc.stdout
    # deployed once (one server process), and stopped at the end
    assert (job / "logs" / "deployment.log").exists()
    assert not alive((job / "server.pid").read_text())


def identified_plan(tmp_path: Path, *, port: int, tasks: list[tuple[str, str]], timeout: int = 30) -> JobPlan:
    """A job whose deployment publishes the port it holds (`port`: the one it prefers; 0: any) and must report
    the identity abcd1234-0123456789ab, as the builtin server does."""
    job = tmp_path / "job"
    plan = make_plan(
        job,
        port=port,
        tasks=tasks,
        timeout=timeout,
        deploy_cmd=f"exec {sys.executable} server.py {port} {job}/state/deployment_port",
    )
    health = f"http://127.0.0.1:{port}/v1/health"
    return replace(
        plan,
        deployment=replace(
            plan.deployment,
            identity="abcd1234-0123456789ab",
            identity_url=health,
            port_file=str(job / "state/deployment_port"),
        ),
    )


def test_clients_reach_the_deployment_on_the_port_it_published(tmp_path: Path):
    """The server takes its port when it starts (here: any free one, as when the planned one is taken) and
    publishes it; the health wait, the identity check and the clients all use that port."""
    plan = identified_plan(
        tmp_path, port=0, tasks=[("a", 'curl -sf "http://127.0.0.1:${DEPLOY_PORT}/v1/health" > out-a.txt')]
    )
    job = Path(plan.job_dir)
    proc = run_job(write_job(tmp_path, plan), REPORTS="abcd1234-0123456789ab")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    port = state(job, "state/deployment_port")
    assert f"the deployment holds port {port}" in proc.stdout
    assert "identity abcd1234-0123456789ab verified" in proc.stdout
    assert state(job, "state/deployment_identity") == "abcd1234-0123456789ab"
    assert "abcd1234-0123456789ab" in (job / "out-a.txt").read_text()


def test_a_taken_port_is_said_in_the_job_log_and_kept_for_status(tmp_path: Path):
    """The planned port is taken: the server serves on one the kernel assigns (the builtin server's
    --port-fallback); the job's log, which an attached run prints, says so, and state/deployment_moved keeps it
    for `evaluate status` (tests/unit/cli/test_widths.py shows it there)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        plan = identified_plan(
            tmp_path, port=port, tasks=[("a", 'curl -sf "http://127.0.0.1:${DEPLOY_PORT}/v1/health" > out-a.txt')]
        )
        job = Path(plan.job_dir)
        step = replace(
            plan.deployment.step, command=f"exec {sys.executable} server.py {port} {job}/state/deployment_port fallback"
        )
        plan = replace(plan, deployment=replace(plan.deployment, step=step))
        proc = run_job(write_job(tmp_path, plan), REPORTS="abcd1234-0123456789ab")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    held = state(job, "state/deployment_port")
    said = f"port {port} was taken: the deployment serves on port {held} instead"
    assert held != str(port) and said in proc.stdout
    assert state(job, "state/deployment_moved") == said
    assert "abcd1234-0123456789ab" in (job / "out-a.txt").read_text()  # the client found it there
    # an attached run on this machine shows the job's state, not its log: the progress's deployment row says it
    import io

    from rich.console import Console

    from ckpteval.cli.progress import Rates, render_progress
    from ckpteval.execution.snapshot import LocalJobView, take_snapshot

    snapshot = take_snapshot(LocalJobView(job), [("a", "a")], None)
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(render_progress(snapshot, Rates(), 80))
    row = next(line for line in out.getvalue().splitlines() if line.startswith("deployment"))
    assert row.split() == ["deployment", "ready", "on", "port", held, f"({port}", "was", "taken)"], out.getvalue()


def test_a_port_answered_by_another_deployment_stops_the_job_before_any_task_request(tmp_path: Path):
    """Health answers 200, but for another deployment (another job's server on the port): the job stops at
    once, says so, and no task client sent anything."""
    plan = identified_plan(tmp_path, port=0, tasks=[("a", "echo sent > out-a.txt")])
    job = Path(plan.job_dir)
    start = time.monotonic()
    proc = run_job(write_job(tmp_path, plan), REPORTS="ffff0000-another-job")
    # whichever sees it first, the job's health wait (exit 3) or the task's client (its task fails), says why
    assert proc.returncode in (1, 3), proc.stdout + proc.stderr
    assert time.monotonic() - start < 20  # at once, not after the readiness timeout (30 s)
    assert "answers for another deployment" in proc.stdout
    assert state(job, "state/deployment") != "ready"
    assert not (job / "state/deployment_identity").exists()
    assert not (job / "out-a.txt").exists()  # the client refused the endpoint before its first request


def test_a_deployment_that_cannot_take_a_port_fails_at_once(tmp_path: Path):
    plan = identified_plan(tmp_path, port=free_port(), tasks=[("a", "true")])
    plan = replace(
        plan,
        deployment=replace(
            plan.deployment,
            step=replace(
                plan.deployment.step, command="echo 'error: Port 8000 on 127.0.0.1 is already in use.'; exit 1"
            ),
        ),
    )
    start = time.monotonic()
    proc = run_job(write_job(tmp_path, plan))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert time.monotonic() - start < 20
    assert "did not take a port" in proc.stdout
    assert "already in use" in proc.stdout


def test_rerun_skips_finished_tasks(tmp_path: Path):
    port = free_port()
    plan = make_plan(tmp_path / "job", port=port, tasks=[("a", "echo x >> count.txt"), ("b", "test -f ok")])
    script = write_job(tmp_path, plan)
    job = Path(plan.job_dir)
    assert run_job(script).returncode == 1
    (job / "ok").touch()
    second = run_job(script)
    assert second.returncode == 0, second.stdout
    assert (job / "count.txt").read_text() == "x\n"  # task a did not run again
    assert "a: already done, skipped" in second.stdout
    assert state(job, "state/finished") == "0"
    # when it started and ended (UTC), so a copy of the job dir fetched later still says how long it took
    started, ended = (time.strptime(state(job, f"state/{n}"), "%Y-%m-%dT%H:%M:%SZ") for n in ("started", "ended"))
    assert started <= ended


def test_deployment_that_dies_fails_with_its_log_tail(tmp_path: Path):
    plan = make_plan(
        tmp_path / "job",
        port=free_port(),
        tasks=[("a", "true")],
        deploy_cmd="echo 'CUDA out of memory (simulated)'; exit 1",
    )
    proc = run_job(write_job(tmp_path, plan))
    job = Path(plan.job_dir)
    assert proc.returncode == 3
    assert "exited before it became healthy" in proc.stdout
    assert "CUDA out of memory (simulated)" in proc.stdout
    assert state(job, "state/deployment") == "failed"
    assert not (job / "tasks/a/state").exists()  # its client, waiting for the model, sent nothing: pending
    assert "a: succeeded" not in proc.stdout


def test_deployment_never_healthy_times_out(tmp_path: Path):
    port = free_port()
    plan = make_plan(
        tmp_path / "job",
        port=port,
        tasks=[("a", "true")],
        timeout=3,
        deploy_cmd=f"echo starting; exec {sys.executable} server.py {port}",
    )
    script = write_job(tmp_path, plan)
    start = time.monotonic()
    proc = run_job(script, DELAY="60")
    assert proc.returncode == 3
    assert time.monotonic() - start < 30
    assert "did not become healthy within 3 s" in proc.stdout
    assert "starting" in proc.stdout  # the log tail
    assert not alive((Path(plan.job_dir) / "server.pid").read_text())  # the slow server was stopped
    assert not (Path(plan.job_dir) / "tasks/a/state").exists()


@pytest.mark.parametrize("during_load", [True, False])
def test_clients_prepare_while_the_model_loads_and_send_once_it_is_healthy(tmp_path: Path, during_load: bool):
    """The clients start with the deployment, not after it: their preparation overlaps the model's load,
    and their first request goes once the health URL answers (here the server takes 2 s to listen).
    `prepare_during_load=false` gives the old order: clients start once the deployment is healthy."""
    port = free_port()
    prepare = 'date +%s.%N > "$TASK.prepared"; '
    send = f'curl -sf -o /dev/null http://127.0.0.1:{port}/v1/health && date +%s.%N > "$TASK.sent"'
    plan = make_plan(tmp_path / "job", port=port, tasks=[("a", send), ("b", send)], parallel=2, waits=False)
    plan = replace(
        plan,
        prepare_during_load=during_load,
        tasks=tuple(
            replace(
                t, runs=tuple(replace(r, step=replace(r.step, command=prepare + CLIENT_WAITS + send)) for r in t.runs)
            )
            for t in plan.tasks
        ),
    )
    job = Path(plan.job_dir)
    started = time.time()
    proc = run_job(write_job(tmp_path, plan), DELAY="2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for task in "ab":
        prepared = float((job / f"{task}.prepared").read_text())
        sent = float((job / f"{task}.sent").read_text())
        if during_load:
            assert prepared - started < 1.5, "the client started only after the model had loaded"
        else:
            assert prepared - started >= 2, "the client started before the deployment was healthy"
        assert sent - started >= 2  # not before the server listened
    assert proc.stdout.count("deployment healthy") == 1
    assert state(job, "state/deployment") == "ready"


SPAN = 'date +%s.%N > "$TASK.start"; sleep 1.5; date +%s.%N > "$TASK.end"'


@pytest.mark.parametrize("parallel", [1, 2])
def test_tasks_run_side_by_side_up_to_the_limit(tmp_path: Path, parallel: int):
    plan = make_plan(tmp_path / "job", port=free_port(), tasks=[(n, SPAN) for n in "abc"], parallel=parallel)
    job = Path(plan.job_dir)
    proc = run_job(write_job(tmp_path, plan))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spans = sorted((float((job / f"{n}.start").read_text()), float((job / f"{n}.end").read_text())) for n in "abc")
    overlaps = sum(1 for i in range(3) for j in range(i + 1, 3) if spans[j][0] < spans[i][1])
    if parallel == 1:
        assert overlaps == 0  # one after another, as before
    else:
        assert spans[1][0] < spans[0][1]  # the first two side by side
        assert spans[2][0] >= min(spans[0][1], spans[1][1])  # the third only once a slot is free
    assert all(state(job, f"tasks/{n}/state") == "succeeded" for n in "abc")


def test_sigterm_stops_every_running_task(tmp_path: Path):
    plan = make_plan(
        tmp_path / "job", port=free_port(), tasks=[(n, f"echo $$ > {n}.pid; sleep 60") for n in "ab"], parallel=2
    )
    job = Path(plan.job_dir)
    proc = subprocess.Popen(
        ["bash", str(write_job(tmp_path, plan))], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    wait_until(
        lambda: pid_written(job / "a.pid") and pid_written(job / "b.pid"), timeout=60, what="both tasks to start"
    )
    os.kill(proc.pid, signal.SIGTERM)  # the job's shell only: it stops its tasks itself
    proc.wait(timeout=60)
    assert proc.returncode == 143 and state(job, "state/finished") == "143"
    for name in ("a.pid", "b.pid", "server.pid"):
        pid = (job / name).read_text()
        wait_until(lambda pid=pid: not alive(pid), timeout=60, what=f"the process of {name} ({pid.strip()}) to end")


def test_sigterm_stops_deployment_and_records_interruption(tmp_path: Path):
    port = free_port()
    plan = make_plan(tmp_path / "job", port=port, tasks=[("a", "echo $$ > task.pid; sleep 60")])
    script = write_job(tmp_path, plan)
    job = Path(plan.job_dir)
    proc = subprocess.Popen(
        ["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True
    )
    wait_until(lambda: pid_written(job / "task.pid"), timeout=60, what="the task to start")
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 143
    assert state(job, "state/finished") == "143"
    assert not alive((job / "task.pid").read_text())
    assert not alive((job / "server.pid").read_text())


def stalling_date(tmp_path: Path, state_file: str) -> str:
    """A PATH whose `date` stalls 2 s the first time it is called once `state_file` says ready: the watcher's
    line right after its mark (`say` reads the clock), so that the race of a stop between the two is certain."""
    real_date = subprocess.run(["bash", "-c", "command -v date"], capture_output=True, text=True).stdout.strip()
    stalls = tmp_path / "bin"
    stalls.mkdir()
    (stalls / "date").write_text(
        "#!/bin/bash\n"
        f'if [ "$(cat {state_file} 2>/dev/null)" = ready ] && mkdir stalled 2>/dev/null; then sleep 2; fi\n'
        f'exec {real_date} "$@"\n'
    )
    (stalls / "date").chmod(0o755)
    return f"{stalls}:{os.environ['PATH']}"


def test_the_healthy_line_is_said_once_when_the_tasks_end_as_the_watcher_marks_the_deployment_ready(tmp_path: Path):
    """The race of stopping the watcher between its two steps (mark ready, say "deployment healthy"), made
    certain: the watcher's line stalls once the deployment is marked ready, and the task ends as soon as it
    sees the mark. The job must still say the line (what `status` and the tests read), once."""
    sees_mark = 'until [ "$(cat state/deployment 2>/dev/null)" = ready ]; do sleep 0.05; done'
    plan = make_plan(tmp_path / "job", port=free_port(), tasks=[("a", sees_mark)])
    job = Path(plan.job_dir)
    proc = run_job(write_job(tmp_path, plan), PATH=stalling_date(tmp_path, "state/deployment"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (job / "stalled").exists()  # the watcher's line was stalled: the tasks ended inside the window
    assert proc.stdout.count("deployment healthy") == 1, proc.stdout
    assert state(job, "state/deployment") == "ready"


def test_a_step_of_several_ranks_ends_when_one_rank_fails():
    """A multi-node deployment is one server: rank 0's script failing must end the step (and so the job's
    health wait), not leave the workers holding it until the readiness timeout."""
    multi = JobPlan(
        invocation="abcd1234",
        job_dir="/jobs/abcd1234",
        tasks=(),
        deployment=DeploymentPlan(
            kind="megatron/export-deploy",
            health_url="http://127.0.0.1:8000/v1/health",
            readiness_timeout=600,
            port=8000,
            step=Step(command="python deploy_ray.py", image="/c/nemo.sqsh", nodes=2),
        ),
    )
    script = render_job_script(multi, launcher="srun-containers")
    deploy_line = next(line for line in script.splitlines() if "--job-name=deployment" in line)
    assert "--kill-on-bad-exit=1" in deploy_line and "--nodes=2 --ntasks=2" in deploy_line
    single = replace(multi, deployment=replace(multi.deployment, step=Step(command="python serve.py", nodes=1)))
    assert "--kill-on-bad-exit" not in render_job_script(single, launcher="srun-containers")


def test_clients_starting_during_the_load_wait_for_the_checkpoint_the_deployment_prepares(tmp_path: Path):
    """A deployment that prepares its checkpoint (`deployment.prepare`) renames it into place when complete;
    the clients read its tokenizer (and mount it, on Slurm), so they start only once it is there."""
    port = free_port()
    checkpoint = tmp_path / "prepared"
    deploy = f"sleep 2; mkdir {checkpoint}; exec {sys.executable} server.py {port}"
    plan = make_plan(
        tmp_path / "job",
        port=port,
        tasks=[("a", f'test -d {checkpoint} && date +%s.%N > "$TASK.start"')],
        deploy_cmd=deploy,
        waits=False,  # the client reads the checkpoint at once, before any request
    )
    plan = replace(plan, clients_need=(str(checkpoint),))
    job = Path(plan.job_dir)
    proc = run_job(write_job(tmp_path, plan))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"the task clients start once the deployment has prepared {checkpoint}" in proc.stdout
    assert (job / "a.start").exists()
    # after the order before (clients once healthy), there is nothing to wait for
    later = replace(plan, prepare_during_load=False)
    assert "have prepared" not in render_job_script(later) and "has prepared" not in render_job_script(later)


@pytest.mark.parametrize(
    ("batching", "deployed"), [("mixes", True), ("honours", True), ("mixes", False)], ids=["mixes", "honours", "none"]
)
def test_tasks_of_different_request_settings_take_turns_where_the_endpoint_mixes_them(
    tmp_path: Path, batching: str, deployed: bool
):
    """The real probe against fake_endpoint.py (batching as Export-Deploy 0.5+ does, or answering each request
    alone): two tasks in two request groups run one after the other, or side by side; every client starts at
    once and waits for its turn as the harness hook does (here in shell); with `deployment=none` too."""
    import threading

    from ckpteval.tasks.harness_hook import ckpteval_settings_probe
    from tests.e2e.tasks.fake_endpoint import make_server

    server = make_server(
        ["--port", "0", "--answer", "words", *(["--batch-window", "0.1"] if batching == "mixes" else [])]
    )
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/completions"
    job = tmp_path / "job"
    client = (
        'date +%s.%N > "started-$TASK"; until [ -e "$CKPTEVAL_REQUEST_TURN" ]; do sleep 0.1; done; '
        'date +%s.%N > "sends-$TASK"; sleep 1; date +%s.%N > "ended-$TASK"'
    )
    plan = make_plan(job, port=free_port(), tasks=[("gen", client), ("score", client)], parallel=2, waits=deployed)
    probe = f"{sys.executable} {ckpteval_settings_probe.__file__} --completions {url} --model fake --out state/p.json"
    plan = replace(
        plan, requests=RequestGroups(groups=((0,), (1,)), words=("gen's generations", "log-likelihood"), probe=probe)
    )
    if not deployed:
        plan = replace(plan, deployment=DeploymentPlan(kind="none", step=None, health_url=None, readiness_timeout=30))
    try:
        proc = run_job(write_job(tmp_path, plan))
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    times = {
        f.name: float(f.read_text()) for f in job.glob("*-*") if f.name.split("-")[0] in ("started", "sends", "ended")
    }
    assert times["started-score"] < times["ended-gen"]  # both clients started (and prepared) at once
    requests = state(job, "state/requests")
    if batching == "mixes":
        assert times["sends-score"] >= times["ended-gen"], times  # score's requests only once gen had ended
        assert requests.startswith("in 2 groups, one after another: the probe found: mixed: ")
        assert "request group 2 of 2: score (log-likelihood)" in proc.stdout
    else:
        assert times["sends-score"] < times["ended-gen"], times  # side by side
        assert requests.startswith("side by side: honoured: ")
    assert "request settings probe: " in proc.stdout
    # what `evaluate status` shows
    from ckpteval.execution.snapshot import LocalJobView, take_snapshot

    assert take_snapshot(LocalJobView(job), [(t.name, t.dir) for t in plan.tasks], None).requests == requests
    assert json.loads((job / "state/p.json").read_text())["verdict"] == ("mixed" if batching == "mixes" else "honoured")
