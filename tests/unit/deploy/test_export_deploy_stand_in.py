"""The Export-Deploy stand-in batches like the release it claims to be (0.6.0): requests arriving together share a
batch run with the first request's settings. Against it, tasks run at once get answers made with another
task's settings; run in the groups the plan makes (`ckpteval.job.batching`), every task gets its own.

The stand-in's Serve deployment class is instantiated here directly, without a Ray cluster, with Ray Serve's
own `serve.batch` doing the batching; its requests go to ckpteval's builtin engine on the tiny model.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpteval.job.batching import RequestSettings, task_groups

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parents[3]
STAND_IN = REPO / "tests" / "infra" / "export-deploy" / "scripts" / "deploy" / "llm" / "mlm" / "deploy_ray.py"
WAIT_S = 0.5  # --batch_wait_timeout_s: requests sent together surely meet in one batch


def load_stand_in() -> Any:
    spec = importlib.util.spec_from_file_location("export_deploy_stand_in", STAND_IN)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def replica(tiny_checkpoint: Path, tiny_loaded: Any) -> Iterator[Any]:
    """One replica of the stand-in's deployment (the session's loaded tiny model behind it), with its event
    loop (`replica.loop`): a replica's batch queues live on the one loop that first used them, as in Serve."""
    import ray.serve.batching

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("ckpteval.deploy.server.load_model", lambda *a, **k: tiny_loaded)
        # outside a Serve replica there is no max_ongoing_requests for the batch queue to compare with
        mp.setattr(ray.serve.batching._BatchQueue, "_warn_if_max_batch_size_exceeds_max_ongoing_requests", lambda s: 0)
        deployment = load_stand_in().make_deployment("tiny", str(tiny_checkpoint), 16, WAIT_S)
        instance = deployment.func_or_class()
        instance.loop = asyncio.new_event_loop()
        yield instance
        instance.scheduler.stop()
        pending = asyncio.all_tasks(instance.loop)  # the batch queues' waiting tasks
        for task in pending:
            task.cancel()
        instance.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        instance.loop.close()


async def post(replica: Any, body: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/completions/ to the replica as Serve's proxy would hand it the request."""
    from starlette.requests import Request

    data = json.dumps(body).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": data, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions/",
        "headers": [(b"content-type", b"application/json")],
        "query_string": b"",
        "server": ("127.0.0.1", 8000),
        "scheme": "http",
        "root_path": "",
    }
    response = await replica(Request(scope, receive))
    return json.loads(response.body)


# What lm-eval's local-completions sends (lm_eval/models/openai_completions.py, _create_payload): a generation
# task's max_gen_toks and temperature, and for every log-likelihood request the same fixed settings.
def generation(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 1234}


def loglikelihood(prompt: str) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True}


def answer_of(response: dict[str, Any]) -> tuple[int, str, tuple[float, ...] | None]:
    """What a client reads: the completion's length and text, and the echoed prompt's log-probabilities."""
    choice = response["choices"][0]
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    return response["usage"]["completion_tokens"], choice["text"], tuple(logprobs[1:]) if logprobs else None


def test_a_batch_runs_with_its_first_requests_settings(replica: Any):
    async def run() -> list[dict[str, Any]]:
        short, long = generation("Hello", 2), generation("World", 9)
        together = await asyncio.gather(post(replica, short), post(replica, long))
        return [*together, await post(replica, long)]

    short, long_batched, long_alone = (answer_of(r) for r in replica.loop.run_until_complete(run()))
    assert short[0] == 2 and long_batched[0] == 2  # 9 asked, the batch's first request's 2 given
    assert long_alone[0] == 9


# Three tasks: two generation tasks of different lengths, one log-likelihood task; each sends its requests
# at once (lm-eval's parallelism), and the tasks themselves run at once unless grouped.
TASKS = {
    "gen_short": [generation(p, 3) for p in ("The cat", "A dog")],
    "gen_long": [generation(p, 10) for p in ("Once upon", "In the")],
    "loglik": [loglikelihood(p) for p in ("The sky is blue", "Water is wet")],
}
SETTINGS = {
    "gen_short": RequestSettings.of(route="completions", logprobs=False, params={"task": "t", "max_new_tokens": 3}),
    "gen_long": RequestSettings.of(route="completions", logprobs=False, params={"task": "t", "max_new_tokens": 10}),
    "loglik": RequestSettings.of(route="completions", logprobs=True, params={}),
}


def run_tasks(replica: Any, groups: tuple[tuple[int, ...], ...]) -> dict[str, list[Any]]:
    """Each group's tasks at once (every request of them sent together), the groups one after another."""
    names = list(TASKS)

    async def run() -> dict[str, list[Any]]:
        answers: dict[str, list[Any]] = {}
        for group in groups:
            batch = [(names[i], body) for i in group for body in TASKS[names[i]]]
            responses = await asyncio.gather(*(post(replica, body) for _, body in batch))
            for (name, _), response in zip(batch, responses, strict=True):
                answers.setdefault(name, []).append(answer_of(response))
        return answers

    return replica.loop.run_until_complete(run())


def same(got: list[Any], want: list[Any]) -> bool:
    return all(
        g[:2] == w[:2] and (g[2] is None) == (w[2] is None) and (g[2] is None or g[2] == pytest.approx(w[2], abs=1e-4))
        for g, w in zip(got, want, strict=True)
    )


def test_tasks_run_in_their_settings_groups_get_their_own_answers(replica: Any):
    names = list(TASKS)
    alone = run_tasks(replica, tuple((i,) for i in range(len(names))))  # one task at a time: the reference
    assert [a[0] for a in alone["gen_short"]] == [3, 3] and [a[0] for a in alone["gen_long"]] == [10, 10]
    assert all(a[2] for a in alone["loglik"])

    at_once = run_tasks(replica, (tuple(range(len(names))),))
    assert not all(same(at_once[n], alone[n]) for n in names)  # what concurrency without the rule gives

    groups = task_groups([SETTINGS[n] for n in names])
    assert groups == ((0,), (1,), (2,))
    grouped = run_tasks(replica, groups)
    assert all(same(grouped[n], alone[n]) for n in names)

    # tasks with the same settings share a group, and their batches, harmlessly
    twin = {**SETTINGS, "gen_long": SETTINGS["gen_short"]}
    assert task_groups([twin[n] for n in names]) == ((0, 1), (2,))
