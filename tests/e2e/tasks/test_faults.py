"""An endpoint that fails mid-task: the harness retries with backoff, then the task fails with the cause.

The four runs start together (each spends most of its time importing the harness) and are checked one by one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest

from ckpteval.errors import EvaluationError
from ckpteval.tasks.results import read_task_result
from ckpteval.tasks.runconfig import TaskPaths
from tests.e2e.tasks.conftest import FakeEndpoint, start_task

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SERVED_BEFORE_FAILING = 10
MAX_RETRIES = 3
PARAMS = {"limit_samples": 20, "parallelism": 2, "max_retries": MAX_RETRIES, "request_timeout": 5}


def _error(task_dir: Path) -> EvaluationError:
    with pytest.raises(EvaluationError) as err:
        read_task_result(TaskPaths(task_dir).output_dir)
    return err.value


def test_endpoint_faults(fake_endpoint: Callable[..., FakeEndpoint], tmp_path: Path) -> None:
    after = ("--fail-after", str(SERVED_BEFORE_FAILING))
    endpoints = {
        "http500": fake_endpoint(*after, "--failure", "500"),
        "dies": fake_endpoint(*after, "--failure", "die"),
        "hangs": fake_endpoint(*after, "--failure", "hang"),
        "no_data": fake_endpoint(),
    }
    procs = {
        name: start_task(
            "adlr_mmlu_pro_5_shot_base" if name == "no_data" else "gsm8k",
            tmp_path / name,
            url=endpoint.url,
            params=PARAMS,
        )
        for name, endpoint in endpoints.items()
    }
    codes = {name: proc.wait(timeout=600) for name, proc in procs.items()}
    assert all(code != 0 for code in codes.values()), codes  # each gave up (proc.wait's timeout is the deadline)

    # 5xx: every failing request is tried max_retries times, with exponential backoff (tenacity's
    # 0.5 s * 2^(n-1), at least 1 s: 1 s, 1 s, 2 s, 4 s, ...)
    err = _error(tmp_path / "http500")
    assert err.message == (
        "The endpoint kept failing and the harness gave up after its retries. "
        'Last endpoint error: {"error":"injected failure: model worker crashed"}'
    )  # the server's own body, as it sent it (lm-eval talks to it directly)
    received = endpoints["http500"].received()
    failing = received[SERVED_BEFORE_FAILING:]
    attempts = Counter(digest for _, digest, _ in failing)
    assert max(attempts.values()) == MAX_RETRIES
    retried = next(d for d, n in attempts.items() if n == MAX_RETRIES)
    times = [t for t, d, _ in failing if d == retried]
    assert times[-1] - times[0] >= 1 + 1 - 0.2

    # the endpoint process dies: connection refused, reported with the connection's reason
    err = _error(tmp_path / "dies")
    assert err.message.startswith("The endpoint stopped answering and the harness gave up after its retries.")
    assert "Last endpoint error: Cannot connect to host 127.0.0.1:" in err.message
    assert "deployment log" in (err.hint or "")
    assert len(endpoints["dies"].received()) == SERVED_BEFORE_FAILING + 1  # the request it died on

    # the endpoint stops answering: each request times out after request_timeout, is retried, then given up
    err = _error(tmp_path / "hangs")
    assert err.message.startswith("Requests to the endpoint timed out and the harness gave up after its retries")
    hung_requests = endpoints["hangs"].received()[SERVED_BEFORE_FAILING:]
    hung = Counter(d for _, d, _ in hung_requests)
    # retried, but no more than max_retries times: giving up is bounded, whatever the machine's speed
    assert 2 <= max(hung.values()) <= MAX_RETRIES
    # and each attempt waited its request_timeout before the next
    retried = next(d for d, n in hung.items() if n == max(hung.values()))
    times = [t for t, d, _ in hung_requests if d == retried]
    assert all(b - a >= PARAMS["request_timeout"] - 0.5 for a, b in pairwise(times))

    # a task with no data offline never reaches the endpoint and says how to provide the data
    err = _error(tmp_path / "no_data")
    assert err.message.startswith("No offline copy of dataset TIGER-Lab/MMLU-Pro")
    assert "dataset_dir" in (err.hint or "")
    assert endpoints["no_data"].received() == []
