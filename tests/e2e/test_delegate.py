"""`evaluate serve-delegate` played against by a training loop, as slime's delegate client behaves.

The model is the builtin deployment of the tiny checkpoint (a real megatron-core server, the session's
shared one) standing in for slime's router. The client posts before the service listens (so its retries
with capped backoff are used), waits with a timeout, and gets metrics that must equal `evaluate`'s own for
the same task, sampling params and samples: the same seeds reach the same server, so both runs must also have
generated the very same responses.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.deploy_support import RunningServer, free_port
from tests.e2e.conftest import MODEL_ID, SharedServers

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = MODEL_ID  # the name slime's router serves the policy under, here the shared server's
# the tiny model's context is 2,048 bytes: zero-shot GSM8K prompts fit, 5-shot ones do not
COMMON = [
    "evaluation.nemo_evaluator_config.config.params.limit_samples=3",
    "+evaluation.nemo_evaluator_config.config.params.extra.num_fewshot=0",
]
BENCHMARK = {"name": "gsm8k", "n_samples_per_eval_prompt": 2, "temperature": 0.8, "top_p": 0.95, "max_response_len": 24}


class DelegateError(RuntimeError):
    pass


def slime_post(url: str, payload: dict[str, Any], *, timeout: float, max_retries: int) -> dict[str, Any]:
    """What slime's SkillsEvalClient does: POST, raise on HTTP errors, retry with min(2**attempt, 30) s sleeps."""
    last: Exception | None = None
    for attempt in range(1, max_retries + 1):
        request = urllib.request.Request(
            url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return dict(json.loads(response.read() or b"{}"))
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last = exc
            if attempt < max_retries:
                time.sleep(min(2**attempt, 30))
    raise DelegateError(f"delegate request failed after {max_retries} attempts: {last}")


def post_once(url: str, payload: Any) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def router(shared_servers: SharedServers) -> RunningServer:
    """The session's shared tiny server stands in for slime's router (its served name is `MODEL`)."""
    return shared_servers.get("tiny")


def _env(root: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("CKPTEVAL_")},
        "XDG_STATE_HOME": str(root / "state"),
        "XDG_CONFIG_HOME": str(root / "config"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }


def _responses(task_dir: Path, repeat: int) -> list[tuple[int, list[Any]]]:
    (path,) = glob.glob(str(task_dir / f"output-rs{repeat}" / "**" / "samples_gsm8k_*.jsonl"), recursive=True)
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return sorted((row["doc_id"], row["resps"]) for row in rows if row["filter"] == "strict-match")


@pytest.mark.long  # 3 min: a router of replicas and two harness runs; the delegate's plan is unit-tested
def test_delegate_answers_like_evaluate(router: RunningServer, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    payload = {"rollout_id": 7, "router_url": router.url, "benchmarks": [BENCHMARK]}
    argv = [
        sys.executable, "-m", "ckpteval.cli", "serve-delegate", "--host", "127.0.0.1", "--port", str(port),
        "--max-concurrent-requests", "1", "--openai-model-name", MODEL, "--output-root", str(tmp_path / "out"),
        *COMMON,
    ]  # fmt: skip
    log = open(tmp_path / "delegate.log", "wb")  # noqa: SIM115 (closed at the end)
    service = subprocess.Popen(argv, cwd=tmp_path, env=_env(tmp_path), stdout=log, stderr=subprocess.STDOUT)
    try:
        # posted while the service is still starting: the first attempts are refused and retried
        answer = slime_post(f"{url}/evaluate", payload, timeout=600, max_retries=6)
        with urllib.request.urlopen(f"{url}/health", timeout=10) as health:
            assert json.loads(health.read()) == {"status": "ok"}

        # malformed requests: 400 with the validation error, and the service keeps serving
        status, body = post_once(f"{url}/evaluate", {**payload, "benchmarks": [{"name": "gsm8k:4"}]})
        assert status == 400 and "n_samples_per_eval_prompt" in body["error"]
        status, body = post_once(f"{url}/evaluate", {"router_url": router.url})
        assert status == 400 and "rollout_id" in body["error"]
        status, body = post_once(f"{url}/evaluate", {**payload, "benchmarks": [{"name": "gsm8kk"}]})
        assert status == 400 and "gsm8k" in body["error"]  # unknown task, with the close match
    finally:
        service.terminate()
        service.wait(timeout=30)
        log.close()

    # the same evaluation through `evaluate` itself
    params = "evaluation.nemo_evaluator_config.config.params"
    argv = [
        sys.executable, "-m", "ckpteval.cli", "-t", "gsm8k:2", "deployment=none",
        f"target.api_endpoint.url={router.url}/v1/completions", f"target.api_endpoint.model_id={MODEL}",
        f"{params}.temperature=0.8", f"{params}.top_p=0.95", f"{params}.max_new_tokens=24", f"{params}.parallelism=1",
        *COMMON,
    ]  # fmt: skip
    own = subprocess.run(argv, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert own.returncode == 0, own.stdout[-3000:] + own.stderr[-3000:]
    (job_dir,) = (tmp_path / "results").iterdir()
    task = json.loads((job_dir / "results.json").read_text())["tasks"]["gsm8k"]

    expected = {
        f"eval/gsm8k/{mode}/{metric}{suffix}": value[key]
        for mode, metrics in task["modes"].items()
        for metric, value in metrics.items()
        for key, suffix in (("value", ""), ("stderr", "_stderr"), ("std_dev", "_std_dev"))
        if value.get(key) is not None
    }
    expected.update({f"eval/gsm8k/{mode}/num_entries": 3.0 for mode in task["modes"]})
    assert set(task["modes"]) == {"pass@1[avg-of-2]", "majority@2", "pass@2"}
    assert answer["metrics"] == pytest.approx(expected)
    assert answer["raw_metrics"]["gsm8k"]["pass@2"]["num_entries"] == 3
    assert answer["job_id"] and answer["rollout_id"] == 7
    # the very same samples: same seeds, same server, same answers
    delegate_task = Path(answer["runs"][0]["output_dir"])
    for repeat in (0, 1):
        assert _responses(delegate_task, repeat) == _responses(job_dir / "tasks" / "gsm8k", repeat)
    assert _responses(delegate_task, 0) != _responses(delegate_task, 1)  # the seeds differ, so do the samples


@pytest.mark.long  # about 3 min on 2 cores: MT-Bench's harness answers and judges one two-turn question
def test_a_judged_benchmark_is_scored_by_the_judge_the_delegate_was_started_with(
    shared_servers: SharedServers, tmp_path: Path
) -> None:
    """`evaluate serve-delegate judge=api ...`: an mtbench request is judged by that judge (an OpenAI-shaped
    stand-in over HTTP), the answer names it and carries the judge errors beside the score."""
    pytest.importorskip("core_evals.mtbench")
    from tests.support.judge_standin import JudgeStandIn

    smol = shared_servers.get("smol")  # SmolLM2-135M-Instruct: MT-Bench talks to its chat route
    judge = JudgeStandIn(model_id="judge-standin", rating=6).start()
    port = free_port()
    params = "evaluation.nemo_evaluator_config.config.params"
    argv = [
        sys.executable, "-m", "ckpteval.cli", "serve-delegate", "--host", "127.0.0.1", "--port", str(port),
        "--max-concurrent-requests", "1", "--openai-model-name", MODEL, "--output-root", str(tmp_path / "out"),
        "judge=api", f"judge.url={judge.url}", f"judge.model_id={judge.model_id}",
        f"{params}.limit_samples=1", f"{params}.max_new_tokens=8",
    ]  # fmt: skip
    log = open(tmp_path / "delegate.log", "wb")  # noqa: SIM115 (closed at the end)
    service = subprocess.Popen(argv, cwd=tmp_path, env=_env(tmp_path), stdout=log, stderr=subprocess.STDOUT)
    try:
        payload = {"rollout_id": 3, "router_url": smol.url, "benchmarks": [{"name": "mtbench"}]}
        answer = slime_post(f"http://127.0.0.1:{port}/evaluate", payload, timeout=1200, max_retries=6)
    finally:
        service.terminate()
        service.wait(timeout=30)
        log.close()
        judge.stop()
    started = (tmp_path / "delegate.log").read_text(errors="replace")
    assert f"judge of judged benchmarks: api judge-standin at {judge.url}" in started
    assert answer["judge"] == {"kind": "api", "model_id": "judge-standin", "url": judge.url}
    metrics = answer["metrics"]
    assert metrics["eval/mtbench/greedy/average_score"] == 6.0  # the stand-in's rating: its verdicts scored it
    assert (metrics["eval/mtbench/greedy/judge_errors"], metrics["eval/mtbench/greedy/judge_judgments"]) == (0, 2)
    assert judge.requests and {r["model"] for r in judge.requests} == {"judge-standin"}
