"""`serve --replicas 2`: two real servers of the tiny model behind one router, over real HTTP."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ckpteval.server.launch import start_local_server
from tests.deploy_support import SERVER_START_TIMEOUT, RunningServer, free_port, score_directly
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_replicas(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    handle = start_local_server(
        checkpoint=tiny_checkpoint,
        port=free_port(),
        log_path=tmp_path_factory.mktemp("replicas") / "router.log",
        served_model_name="megatron-model",
        device="cpu",
        replicas=2,
        timeout=SERVER_START_TIMEOUT,
    )
    server = RunningServer(handle)
    yield server
    server.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_shared_prefixes_through_the_router_score_as_computed_whole(
    two_replicas: RunningServer, tiny_loaded: Any
) -> None:
    """Each replica's prefix cache and the router's preference for the replica holding a prompt's start."""
    runner = tiny_loaded.runner
    context = "A few shots of context that every choice repeats, " * 3
    rows = [runner.tokenizer.encode(f"{context} item {i}:" + ending) for i in range(3) for ending in (" a", " bb")]

    def score(tokens: list[int]) -> list[float]:
        body = {"prompt": tokens, "max_tokens": 0, "logprobs": 1, "echo": True, "temperature": 0}
        status, payload = two_replicas.post("/v1/completions", body)
        assert status == 200, payload
        return list(payload["choices"][0]["logprobs"]["token_logprobs"][1:])

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(score, rows))
    for got, expected in zip(results, runner.score(rows), strict=True):
        assert got == pytest.approx(expected.token_logprobs, abs=1e-4)
    stats = two_replicas.get("/v1/stats")[1]
    assert stats["prompt_tokens"] == sum(len(r) for r in rows)
    assert stats["cached_tokens"] > 0.5 * stats["prompt_tokens"], stats  # one shared start: one replica's cache


def test_requests_spread_over_replicas_and_survive_one_dying(two_replicas: RunningServer, tiny_loaded: Any) -> None:
    server = two_replicas
    rows_before = server.get("/v1/stats")[1]["score_rows"]
    served_before = [r["requests"] for r in server.get("/v1/health")[1]["replicas"]]
    status, health = server.get("/v1/health")
    assert status == 200 and health["status"] == "healthy" and health["replicas_serving"] == 2
    pids = [r["pid"] for r in health["replicas"]]
    assert len(set(pids)) == 2 and all(_alive(p) for p in pids)

    tokenizer = tiny_loaded.runner.tokenizer
    prompts = [tokenizer.encode(f"replica test {i}: " + "x" * (5 * i)) for i in range(24)]

    def score(tokens: list[int]) -> list[float]:
        body = {"prompt": tokens, "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
        status, payload = server.post("/v1/completions", body)
        assert status == 200, payload
        return list(payload["choices"][0]["logprobs"]["token_logprobs"][1:-1])

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(score, prompts))
    for tokens, got in zip(prompts, results, strict=True):
        assert got == pytest.approx(score_directly(tiny_loaded.runner.model, tokens), abs=1e-4)
    health = server.get("/v1/health")[1]
    served = [r["requests"] - b for r, b in zip(health["replicas"], served_before, strict=True)]
    assert sum(served) == 24 and min(served) > 0, served  # both replicas took a share
    stats = server.get("/v1/stats")[1]
    assert stats["score_rows"] - rows_before == 24 and len(stats["replicas"]) == 2

    os.kill(pids[0], signal.SIGKILL)
    wait_until(
        lambda: server.get("/v1/health")[1]["replicas_serving"] == 1,
        timeout=60,
        what="the router to notice the dead replica",
    )
    status, health = server.get("/v1/health")
    assert status == 200 and health["status"] == "healthy"
    dead = health["replicas"][0]
    assert dead["healthy"] is False and "exited with code -9" in dead["problem"]
    with ThreadPoolExecutor(4) as pool:  # the other replica serves everything now
        after = list(pool.map(score, prompts[:8]))
    assert all(a == pytest.approx(b, abs=1e-4) for a, b in zip(after, results[:8], strict=True))
    assert "Replica 0" in server.log() and "1 of 2 replicas serving" in server.log()

    server.stop()
    wait_until(lambda: not _alive(pids[1]), timeout=60, what="the router's stop to end its other replica")


def test_the_command_line_carries_the_replicas() -> None:
    from ckpteval.server.launch import serve_command

    argv = serve_command(python="python", checkpoint="/c", port=1, served_model_name="m", replicas=4)
    assert argv[argv.index("--replicas") + 1] == "4"
    assert "--replicas" not in serve_command(python="python", checkpoint="/c", port=1, served_model_name="m")


def test_a_prompt_start_goes_to_the_replica_that_served_it_unless_that_one_is_much_busier() -> None:
    from typing import cast

    from ckpteval.server.router import AFFINITY_SLACK, Replica, Router, prompt_start

    replicas = [cast(Replica, type("R", (), {"index": i, "alive": True, "in_flight": 0})()) for i in range(2)]
    router = Router(replicas)
    key = prompt_start(b'{"prompt": "The same ten-shot context, then choice A", "echo": true}')
    assert key == prompt_start(b'{"prompt": ["The same ten-shot context, then choice A"]}')
    first = router.pick(set(), key)
    assert first is not None
    first.in_flight = AFFINITY_SLACK  # busier, but not much: it still holds the prefix
    assert router.pick(set(), key) is first and router.affinity_hits == 1
    first.in_flight = AFFINITY_SLACK + 1
    other = router.pick(set(), key)
    assert other is not first  # much busier: the least busy one takes it, and holds the prefix from now on
    first.in_flight = 0
    other.in_flight = 1
    assert router.pick(set(), key) is other
    assert prompt_start(b"not json") is None and prompt_start(b'{"messages": []}') is None
