"""Real tasks through `nemo-evaluator run_eval` against a served Megatron model, with packaged data."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

import pytest

from ckpteval.tasks.harness_hook import ckpteval_offline_data as od
from ckpteval.tasks.progress import Progress, read_progress
from ckpteval.tasks.results import read_task_result
from tests.e2e.conftest import ServedModel
from tests.e2e.tasks.conftest import FakeEndpoint, TaskRun, run_task

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# CPU serving is slow: one request per connection slot at a time, and a timeout that also covers the time a
# request waits for a slot (nvidia-lm-eval's aiohttp total timeout), so the whole run must fit in it.
SLOW_ENDPOINT = {"parallelism": 2, "request_timeout": 900}


@pytest.fixture(scope="module")
def hellaswag_run(
    served_model: Callable[[str], ServedModel], tmp_path_factory: pytest.TempPathFactory
) -> tuple[TaskRun, ServedModel]:
    model = served_model("smol")
    params = {"limit_samples": 5, "extra": {"tokenizer": model.tokenizer, "tokenizer_backend": "huggingface"}}
    run = run_task(
        "hellaswag", tmp_path_factory.mktemp("hs") / "hellaswag", url=model.url, params={**params, **SLOW_ENDPOINT}
    )
    return run, model


def test_hellaswag_on_smollm2(hellaswag_run: tuple[TaskRun, ServedModel]) -> None:
    run, _ = hellaswag_run
    assert run.returncode == 0, run.paths.log.read_text()[-3000:]
    result = read_task_result(run.paths.output_dir)
    assert set(result.metrics) == {"acc", "acc_norm"} and result.n_samples == 5
    for metric in result.metrics.values():
        assert 0.0 <= metric.value <= 1.0 and metric.stderr is not None and metric.n_samples == 5
    offline = json.loads((run.paths.output_dir / od.REPORT_FILE).read_text())["datasets"]
    assert [(r["dataset"], r["served_from"], r["splits"]) for r in offline] == [
        ("Rowan/hellaswag", "package", {"validation": 80, "train": 20})  # lm-eval asks for `hellaswag`
    ]
    # progress counts what the results count: 5 documents done, each once all 4 of its endings were answered
    assert read_progress(run.paths.output_dir) == Progress(20, 20, docs=result.n_samples, docs_total=5)


def test_rerun_sends_no_request_again(
    hellaswag_run: tuple[TaskRun, ServedModel], fake_endpoint: Callable[..., FakeEndpoint]
) -> None:
    run, model = hellaswag_run
    assert run.returncode == 0
    first = read_task_result(run.paths.output_dir)
    # a counting proxy in front of the same server; drop lm-eval's own cache so that only nemo-evaluator's
    # response cache can answer
    proxy = fake_endpoint("--upstream", model.url.rsplit("/v1/", 1)[0])
    for cache in run.paths.output_dir.glob("lm_cache*"):
        shutil.rmtree(cache) if cache.is_dir() else cache.unlink()
    params = {"limit_samples": 5, "extra": {"tokenizer": model.tokenizer, "tokenizer_backend": "huggingface"}}
    # the cache key is the request body, which does not contain the URL: a different URL still hits it, as
    # long as the deployment reports the checkpoint content that gave the cached answers (its /v1/health,
    # here through the proxy; the job gives its clients that URL)
    health = proxy.url.rsplit("/v1/", 1)[0] + "/v1/health"
    again = run_task("hellaswag", run.paths.task_dir, url=proxy.url, params={**params, **SLOW_ENDPOINT}, health=health)
    assert again.returncode == 0, again.paths.log.read_text()[-3000:]
    received = proxy.received()
    # only nemo-evaluator's capability check (a fixed probe prompt) reached the server; no task request did
    assert [start for _, _, start in received] == [json.dumps("3 + 3 = 6")]
    second = read_task_result(run.paths.output_dir)
    assert second.metrics == first.metrics
    # replayed answers complete their documents too: the rerun's progress still counts all 5
    assert read_progress(run.paths.output_dir) == Progress(20, 20, docs=5, docs_total=5)
