"""Model-written code runs contained: time, memory, network, file system, signals, secrets."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpteval.tasks.harness_hook import ckpteval_sandbox as sandbox
from ckpteval.tasks.harness_hook.ckpteval_code_eval import SandboxedCodeEval, estimate_pass_at_k
from tests.support.waiting import wait_until

ISOLATION = sandbox.isolation()
NAMESPACES = (
    "unprivileged user namespaces (`unshare --user --map-root-user --net --pid` must work: "
    "sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1 where it exists, and no "
    "kernel.apparmor_restrict_unprivileged_userns=1)"
)
# a program that ends by itself (passes, fails or is refused) gets a timeout no load reaches: only the tests of
# the timeout itself depend on the clock (the 3 s default timed out starting Python at load 25)
ENDS_BY_ITSELF = 120.0
LANDLOCK = "Landlock (Linux >= 5.13 with `landlock` in /sys/kernel/security/lsm, or lsm=...,landlock at boot)"
needs_namespaces = pytest.mark.skipif(not ISOLATION.network_namespace, reason=f"needs {NAMESPACES}")
needs_landlock = pytest.mark.skipif(ISOLATION.landlock_abi < 1, reason=f"needs {LANDLOCK}")
needs_signal_isolation = pytest.mark.skipif(
    not ISOLATION.network_namespace and ISOLATION.landlock_abi < 6,
    reason=f"needs {NAMESPACES} (a PID namespace), or Landlock ABI >= 6 (Linux >= 6.12)",
)


def _nothing_else_arrived(port: int, received: list[bytes], timeout: float = 60.0) -> None:
    """Assert that the listener got no connection before now: connect to it ourselves and wait (with a
    deadline) until ours is recorded; it accepts in arrival order, so an earlier one would come first."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(b"control")
    wait_until(
        lambda: b"control" in received, timeout=timeout, what="the listener to record our own connection", interval=0.01
    )
    assert received == [b"control"]


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on 127.0.0.1 that records whatever reaches it."""
    received: list[bytes] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                received.append(conn.recv(100) or b"<connected>")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1], received
    stop.set()
    thread.join()
    srv.close()


def test_a_correct_program_passes_and_can_use_its_temp_dir() -> None:
    program = "open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'\nimport math\n"
    assert sandbox.run_program(program, timeout=ENDS_BY_ITSELF) == sandbox.Outcome(True, "passed")


def test_failures_are_failed() -> None:
    assert sandbox.run_program("assert 1 == 2", timeout=ENDS_BY_ITSELF).result.startswith("failed: AssertionError")
    assert sandbox.run_program("def f(:", timeout=ENDS_BY_ITSELF).result.startswith("failed: SyntaxError")
    # exiting early is not passing, whatever the exit status
    assert not sandbox.run_program("import sys; sys.exit(0)", timeout=ENDS_BY_ITSELF).passed
    assert sandbox.run_program("import os; os._exit(0)", timeout=ENDS_BY_ITSELF) == sandbox.Outcome(
        False, "failed: the program ended without reporting a result"
    )
    assert not sandbox.run_program("print('passed')\nraise SystemExit(0)", timeout=ENDS_BY_ITSELF).passed


def test_an_infinite_loop_times_out() -> None:
    start = time.monotonic()
    assert sandbox.run_program("while True:\n    pass", timeout=1.0) == sandbox.Outcome(False, "timed out")
    assert time.monotonic() - start < 1.0 + 5


def test_a_program_that_ignores_the_alarm_is_killed(tmp_path: Path) -> None:
    program = "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(60)"
    start = time.monotonic()
    assert sandbox.run_program(program, timeout=1.0) == sandbox.Outcome(False, "timed out")
    assert time.monotonic() - start < 1.0 + sandbox._KILL_GRACE_S + 3


def test_a_huge_allocation_fails_without_hurting_us() -> None:
    for program in ("x = bytearray(50 * 1024**3)", "x = [0] * (10**10)", "x = ' ' * (4 * 1024**3)"):
        outcome = sandbox.run_program(program, memory_mb=512, timeout=ENDS_BY_ITSELF)
        assert outcome == sandbox.Outcome(False, "failed: MemoryError: "), program


def test_no_network(listener: tuple[int, list[bytes]]) -> None:
    port, received = listener
    program = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'leak')"
    outcome = sandbox.run_program(program, timeout=ENDS_BY_ITSELF)
    assert not outcome.passed and outcome.result.startswith("failed:")
    _nothing_else_arrived(port, received)


@needs_landlock
def test_no_writes_outside_its_temp_dir(tmp_path: Path) -> None:
    target = tmp_path / "outside.txt"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for program in (
        f"open({str(target)!r}, 'w').write('x')",
        f"import os; os.remove({str(victim)!r})",
        f"import os; os.mkdir({str(tmp_path / 'newdir')!r})",
        f"import shutil; shutil.rmtree({str(tmp_path)!r})",
    ):
        outcome = sandbox.run_program(program, timeout=ENDS_BY_ITSELF)
        assert not outcome.passed and "PermissionError" in outcome.result, (program, outcome)
    assert not target.exists() and victim.read_text() == "keep me" and not (tmp_path / "newdir").exists()


@needs_namespaces
def test_forked_children_do_not_outlive_the_program(tmp_path: Path) -> None:
    marker = f"ckpteval-sandbox-test-{os.getpid()}-{time.time_ns()}"
    program = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execvp('sleep', ['sleep', '300', {marker!r}])\n"
        "time.sleep(60)\n"
    )
    assert sandbox.run_program(program, timeout=1.0) == sandbox.Outcome(False, "timed out")

    # the kernel takes the PID namespace down as its init exits: the child is gone (not merely later)
    def child() -> str:
        return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False).stdout.strip()

    wait_until(lambda: not child(), timeout=60, what="the forked child to end with the program", context=child)


def test_no_secrets_from_the_evaluator_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "secret-value")
    monkeypatch.setenv("OPENAI_API_KEY", "secret-value")
    program = "import os\nassert 'secret-value' not in repr(dict(os.environ)), 'leaked'"
    assert sandbox.run_program(program, timeout=ENDS_BY_ITSELF).passed


@needs_signal_isolation
def test_it_cannot_signal_the_evaluator() -> None:
    program = f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)"
    outcome = sandbox.run_program(program, timeout=ENDS_BY_ITSELF)
    assert not outcome.passed  # and we are still here


def test_a_flood_of_output_does_not_block() -> None:
    program = "import sys\nfor _ in range(200000):\n    print('x' * 100)\n    sys.stderr.write('y' * 100)"
    assert sandbox.run_program(program, timeout=ENDS_BY_ITSELF).passed


def test_fallback_without_namespaces_or_landlock_still_blocks_sockets(
    monkeypatch: pytest.MonkeyPatch, listener: tuple[int, list[bytes]]
) -> None:
    monkeypatch.setattr(sandbox, "_ISOLATION", sandbox.Isolation(network_namespace=False, landlock_abi=0))
    port, received = listener
    outcome = sandbox.run_program(
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)", timeout=ENDS_BY_ITSELF
    )
    assert outcome.result == "failed: PermissionError: network access is disabled in the ckpteval sandbox"
    assert sandbox.run_program("while True:\n    pass", timeout=1.0).result == "timed out"
    assert sandbox.run_program("x = bytearray(50 * 1024**3)", timeout=ENDS_BY_ITSELF).result == "failed: MemoryError: "
    assert "socket constructors disabled" in sandbox.isolation().describe()
    _nothing_else_arrived(port, received)


def test_this_machine_gives_full_isolation() -> None:
    # the CI and development machines must have user namespaces and Landlock: the tests above that need them
    # skip without them, and this one says which is missing (the sandbox then runs in its weaker fallback,
    # see docs/tasks.md)
    iso = sandbox.isolation()
    missing = [NAMESPACES] if not iso.network_namespace else []
    if iso.landlock_abi < 4:
        missing.append(f"{LANDLOCK}, ABI >= 4 (Linux >= 6.7); this kernel gives ABI {iso.landlock_abi}")
    assert not missing, "this machine lacks " + "; ".join(missing)


UNPRIVILEGED_CHECK = """
import json, sys
sys.path.insert(0, sys.argv[1])
import ckpteval_sandbox as sb
cases = {{
    "pass": "assert 1 + 1 == 2",
    "loop": "while True: pass",
    "alloc": "x = bytearray(50 * 1024**3)",
    "net": "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)",
    "write": "open({target!r}, 'w').write('x')",
}}
timeouts = {{k: 1.0 if k == "loop" else {ends_by_itself} for k in cases}}
print(json.dumps({{k: sb.run_program(v, timeout=timeouts[k]).result for k, v in cases.items()}}))
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can read and write (pytest's tmp_path is private to its owner)."""
    path = Path(tempfile.mkdtemp(prefix="ckpteval-sandbox-test-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_landlock
def test_contained_when_run_by_an_unprivileged_user(shared_dir: Path, listener: tuple[int, list[bytes]]) -> None:
    port, received = listener
    hook = shared_dir / "hook"
    shutil.copytree(Path(sandbox.__file__).parent, hook)
    hook.chmod(0o755)
    target = shared_dir / "written-by-nobody"  # the directory is world-writable: only the sandbox stops this
    argv = [
        sys.executable,
        "-c",
        UNPRIVILEGED_CHECK.format(port=port, target=str(target), ends_by_itself=ENDS_BY_ITSELF),
        str(hook),
    ]
    if os.geteuid() == 0:  # as root: drop to nobody (the Slurm test user's situation)
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", *argv[1:]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert results["pass"] == "passed" and results["loop"] == "timed out"
    assert results["alloc"] == "failed: MemoryError: "
    assert results["net"].startswith("failed:") and results["write"].startswith("failed: PermissionError")
    assert not target.exists()
    _nothing_else_arrived(port, received)


# ---- the code_eval stand-in ----


def test_pass_at_k_estimator() -> None:
    assert estimate_pass_at_k(10, 0, 1) == 0.0
    assert estimate_pass_at_k(10, 10, 5) == 1.0
    assert estimate_pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert estimate_pass_at_k(5, 2, 2) == pytest.approx(1 - (3 * 2) / (5 * 4))


def test_code_eval_scores_like_the_hub_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    metric = SandboxedCodeEval()
    references = ["assert add(2, 3) == 5", "assert twice(4) == 8"]
    predictions = [
        ["def add(a, b):\n    return a + b", "def add(a, b):\n    return a - b"],
        ["def twice(x):\n    while True: pass", "def twice(x):\n    return 2 * x"],
    ]
    # one timeout for all four: long enough for the three that end by themselves to start at a high load
    pass_at_k, results = metric.compute(references=references, predictions=predictions, k=[1, 2, 3], timeout=10.0)
    assert pass_at_k == {"pass@1": pytest.approx(0.5), "pass@2": pytest.approx(1.0)}  # no pass@3: 2 samples
    assert [r["passed"] for _, r in results[0]] == [True, False]
    assert [r["result"] for _, r in results[1]] == ["timed out", "passed"]


def test_code_eval_needs_the_same_opt_in_as_the_hub_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    with pytest.raises(ValueError, match="HF_ALLOW_CODE_EVAL=1"):
        SandboxedCodeEval().compute(references=["pass"], predictions=[["pass"]], k=[1])
