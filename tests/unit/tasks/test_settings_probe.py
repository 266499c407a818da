"""The request-settings probe (`ckpteval_settings_probe`) over real HTTP: against an endpoint that batches as
Export-Deploy 0.5+ does (a batch answered with its first request's settings) it says `mixed`; against the
same endpoint answering each request alone it says `honoured`; one it cannot tell about is `unknown`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckpteval.tasks.harness_hook import ckpteval_settings_probe as settings_probe
from tests.e2e.tasks.fake_endpoint import make_server

PROBE = Path(settings_probe.__file__)


@pytest.fixture
def endpoint() -> Iterator[Callable[..., str]]:
    """`endpoint(*fake_endpoint args)`: fake_endpoint.py served in a thread; its completions URL."""
    servers = []

    def start(*args: str) -> str:
        server = make_server(["--port", "0", *args])
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/v1/completions"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_an_endpoint_that_batches_with_the_first_requests_settings_is_found_out(
    endpoint: Callable[..., str], tmp_path: Path
) -> None:
    log = tmp_path / "batches.jsonl"
    url = endpoint("--answer", "words", "--batch-window", "0.1", "--batch-log", str(log))
    verdict = settings_probe.probe({"completions": url}, "fake", timeout=10)
    assert verdict.verdict == "mixed", verdict
    # what it saw is what the stand-in did: requests answered with another request's settings
    seen = "\n".join(verdict.differences)
    assert "log-likelihood sent after generation" in seen and "no log-probabilities" in seen
    assert "the prompt echoed" in seen  # a generation batched behind the log-likelihood request
    assert "completion tokens" in seen  # max_tokens 1 and 8 mixed
    mixed = [json.loads(line) for line in log.read_text().splitlines() if json.loads(line)["mixed"]]
    assert mixed and verdict.seconds < 10


def test_an_endpoint_that_honours_each_request_passes(endpoint: Callable[..., str]) -> None:
    url = endpoint("--answer", "words")  # the same answers, no batching
    verdict = settings_probe.probe({"completions": url}, "fake", timeout=10)
    assert verdict.verdict == "honoured", verdict
    assert verdict.differences == [] and verdict.left_out == []
    assert "log-likelihood" in verdict.reason and "stop" in verdict.reason  # the stop-word request was sent


def test_an_endpoint_that_answers_nothing_is_unknown(endpoint: Callable[..., str]) -> None:
    url = endpoint("--fail-after", "0", "--count-probe")  # every completions request: HTTP 500
    verdict = settings_probe.probe({"completions": url}, "fake", timeout=10)
    assert verdict.verdict == "unknown"
    assert all("fails even alone (HTTP 500" in line for line in verdict.left_out)


def test_the_job_runs_it_as_a_script(endpoint: Callable[..., str], tmp_path: Path) -> None:
    """What the job script does: the verdict is the last line, the details in --out."""
    url = endpoint("--answer", "words", "--batch-window", "0.1")
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, str(PROBE), "--completions", url, "--model", "fake", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("mixed: ")
    assert json.loads(out.read_text())["verdict"] == "mixed"
