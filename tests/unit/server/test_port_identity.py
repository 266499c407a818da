"""A deployment answers only for itself: the builtin server holds its port from its first second (no other
server can share it), publishes the port it holds, reports the job's identity token, and jobs started at
the same instant on one machine each reach their own server."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from ckpteval.errors import DeploymentError
from ckpteval.server.serve import LoadingResponder, ServeOptions, bind_socket, bound_port, hold_port
from tests.deploy_support import free_port
from tests.support.waiting import wait_until
from tests.unit.job.test_script import make_plan, write_job


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_port_another_server_holds_is_refused_even_when_both_ask_to_reuse_it() -> None:
    """Two sockets with SO_REUSEADDR may both bind a port nobody listens on yet (how two servers once shared
    port 8000); the server listens as it binds, so the second one is refused, whatever the order."""
    first = bind_socket("127.0.0.1", 0)
    try:
        with pytest.raises(DeploymentError, match=f"Port {bound_port(first)} on 127.0.0.1 is already in use"):
            bind_socket("127.0.0.1", bound_port(first))
    finally:
        first.close()


def test_a_taken_port_falls_back_to_a_free_one_and_is_published(tmp_path: Path) -> None:
    taken = bind_socket("127.0.0.1", 0)
    port_file = tmp_path / "state" / "deployment_port"
    try:
        options = ServeOptions(checkpoint=tmp_path, port=bound_port(taken), port_file=port_file, port_fallback=True)
        held = hold_port(options)
        try:
            assert bound_port(held) != bound_port(taken)
            assert port_file.read_text().strip() == str(bound_port(held))
        finally:
            held.close()
        with pytest.raises(DeploymentError, match="already in use"):  # without the fallback: refused
            hold_port(replace(options, port_fallback=False))
    finally:
        taken.close()


def test_while_loading_the_server_answers_503_with_its_identity_and_hands_the_socket_over(tmp_path: Path) -> None:
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{bound_port(sock)}/v1/health"
    try:
        responder = LoadingResponder(sock, "inv1-abc").start()
        assert _get(url) == (503, {"status": "loading", "deployment": "inv1-abc"})
        responder.stop()
        # the socket is intact and still ours: the real server accepts on it
        with socket.create_connection(("127.0.0.1", bound_port(sock)), timeout=5) as client:
            conn, _ = sock.accept()
            conn.close()
            assert client
    finally:
        sock.close()


def test_servers_started_at_the_same_instant_on_the_same_port_never_share_it(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """The race itself, many times over and cheaply: two servers started together on one port each hold a
    port of their own, while both run, and publish it before loading anything (both are stopped as soon as
    both have published, long before the model would be loaded)."""
    for attempt in range(8):
        port = free_port()
        files = [tmp_path / f"{attempt}-{i}.port" for i in range(2)]
        argv = [sys.executable, "-m", "ckpteval.server", "serve", "--checkpoint", str(tiny_checkpoint)]
        started = [
            subprocess.Popen(
                [*argv, "--port", str(port), "--port-file", str(f), "--port-fallback"], stderr=subprocess.PIPE
            )
            for f in files
        ]
        try:
            wait_until(
                lambda files=files, started=started: (
                    all(f.exists() for f in files) or any(p.poll() is not None for p in started)
                ),
                timeout=120,
                what="both servers to publish their ports",
            )
            assert all(p.poll() is None for p in started), "a server exited before both held a port"
            ports = {f.read_text().strip() for f in files}
            assert len(ports) == 2 and str(port) in ports, ports
        finally:
            for p in started:
                p.kill()
                p.communicate(timeout=60)


def test_jobs_started_at_the_same_instant_on_the_same_port_each_reach_their_own_server(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """What the issue saw: two jobs planned port P, both servers bound it, and one answered both jobs. Now
    each job's server holds its own port (the planned one, or one the kernel assigns), reports that job's
    identity in /v1/health and /v1/models, and each job's client gets its answers from its own server."""
    from ckpteval.server.launch import serve_command

    port = free_port()  # the "default" port both jobs plan
    jobs = []
    for name in ("model-a", "model-b"):
        job = tmp_path / name
        argv = serve_command(
            python=sys.executable,
            checkpoint=str(tiny_checkpoint),
            port=port,
            served_model_name=name,
            device="cpu",
            identity=f"{name}-identity",
            port_file=str(job / "state/deployment_port"),
        )
        ask = (
            'curl -sf "http://127.0.0.1:${DEPLOY_PORT}/v1/models" > models.json && '
            'curl -sf "http://127.0.0.1:${DEPLOY_PORT}/v1/completions" -H "Content-Type: application/json" '
            f'-d \'{{"model": "{name}", "prompt": "hello", "max_tokens": 2}}\' > answer.json'
        )
        plan = make_plan(job, port=port, tasks=[("t", ask)], timeout=240, deploy_cmd=f"exec {shlex.join(argv)}")
        plan = replace(
            plan,
            deployment=replace(
                plan.deployment,
                identity=f"{name}-identity",
                identity_url=plan.deployment.health_url,
                port_file=str(job / "state/deployment_port"),
            ),
        )
        jobs.append((name, job, write_job(tmp_path, plan)))
    running = [subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, text=True) for _, _, script in jobs]
    outputs = [p.communicate(timeout=300)[0] for p in running]
    ports = set()
    for (name, job, _), proc, output in zip(jobs, running, outputs, strict=True):
        assert proc.returncode == 0, output + (job / "logs/deployment.log").read_text()
        assert f"identity {name}-identity verified" in output  # /v1/health reported it
        assert json.loads((job / "models.json").read_text())["data"][0]["deployment"] == f"{name}-identity"
        assert json.loads((job / "answer.json").read_text())["model"] == name  # its own server answered
        ports.add((job / "state/deployment_port").read_text().strip())
    assert len(ports) == 2 and str(port) in ports  # one got the planned port, the other another one
