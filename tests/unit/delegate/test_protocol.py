"""The delegate's request validation and metric shapes (no model, no HTTP)."""

from __future__ import annotations

import pytest

from ckpteval.delegate.protocol import RequestError, flat_delegate_metrics, parse_request, raw_metrics
from ckpteval.delegate.service import DelegateSettings, benchmark_task, request_overrides
from ckpteval.results.model import Metric, TaskOutcome

GOOD = {
    "rollout_id": 3,
    "router_url": "http://10.0.0.1:30000/",
    "defaults": {"temperature": 0.6, "top_p": 0.95, "max_response_len": 8192},
    "benchmarks": [
        {"name": "gsm8k", "n_samples_per_eval_prompt": 4, "max_response_len": 1024, "top_k": 20},
        {"name": "adlr_humaneval_greedy"},
    ],
}


def test_benchmarks_take_unset_fields_from_defaults():
    request = parse_request(GOOD)
    assert request.router_url == "http://10.0.0.1:30000"
    gsm8k, humaneval = request.benchmarks
    assert (gsm8k.repeats, gsm8k.temperature, gsm8k.max_response_len, gsm8k.top_k) == (4, 0.6, 1024, 20)
    assert (humaneval.repeats, humaneval.temperature, humaneval.max_response_len) == (0, 0.6, 8192)
    assert benchmark_task(gsm8k) == {
        "name": "gsm8k",
        "repeats": 4,
        "nemo_evaluator_config": {"config": {"params": {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 1024}}},
        "request_params": {"top_k": 20},
    }


def test_overrides_point_at_the_router_and_cap_concurrency(tmp_path):
    settings = DelegateSettings(output_root=tmp_path, max_concurrent_requests=64, overrides=("a.b=1",))
    overrides = request_overrides(settings, parse_request(GOOD), tmp_path)
    assert overrides[0] == "a.b=1"  # the service's own first: what follows must hold
    assert "target.api_endpoint.url=http://10.0.0.1:30000/v1/completions" in overrides
    assert "target.api_endpoint.model_id=slime-openai-model" in overrides
    assert "evaluation.nemo_evaluator_config.config.params.parallelism=64" in overrides


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        ([], "expected a JSON object"),
        ({"router_url": "http://r"}, "rollout_id: missing"),
        ({**GOOD, "rollout_id": "7"}, "rollout_id: expected an integer"),
        ({**GOOD, "router_url": "10.0.0.1:30000"}, "router_url"),
        ({**GOOD, "benchmarks": [{"name": "gsm8k:4"}]}, "n_samples_per_eval_prompt"),
        ({**GOOD, "benchmarks": [{"name": ""}]}, "benchmarks[0].name: missing"),
        ({**GOOD, "benchmarks": [{"name": "a", "temprature": 1}]}, "unknown key(s) temprature"),
        ({**GOOD, "benchmarks": [{"name": "a", "top_p": 1.5}]}, "top_p: must be between"),
        ({**GOOD, "benchmarks": [{"name": "a", "n_samples_per_eval_prompt": -1}]}, "at least 0"),
        ({**GOOD, "benchmarks": [{"name": "a"}, {"name": "a"}]}, "named twice"),
        ({**GOOD, "extra": 1}, "unknown key(s) extra"),
    ],
)
def test_malformed_requests_say_what_is_wrong(body, message):
    with pytest.raises(RequestError) as err:
        parse_request(body)
    assert message in str(err.value)


def test_metrics_nest_like_nemo_skills_and_flatten_with_the_eval_prefix():
    modes = {
        "pass@1[avg-of-2]": {"em": Metric(0.5, 0.25, 4, std_dev=0.35)},
        "majority@2": {"em": Metric(0.25, None, 4)},
        "pass@2": {"em": Metric(0.75, None, 4)},
    }
    outcome = TaskOutcome(name="gsm8k", status="succeeded", metrics={}, n_samples=4, repeats=2, modes=modes)
    raw = raw_metrics(outcome)
    assert raw["pass@1[avg-of-2]"] == {"em": 0.5, "em_stderr": 0.25, "em_std_dev": 0.35, "num_entries": 4}
    flat = flat_delegate_metrics({"gsm8k": raw})
    assert flat["eval/gsm8k/pass@2/em"] == 0.75
    assert flat["eval/gsm8k/majority@2/num_entries"] == 4.0
    greedy = TaskOutcome(name="m", status="succeeded", metrics={"acc": Metric(0.3, 0.1, 10)}, n_samples=10)
    assert flat_delegate_metrics({"m": raw_metrics(greedy)}) == {
        "eval/m/greedy/acc": 0.3, "eval/m/greedy/acc_stderr": 0.1, "eval/m/greedy/num_entries": 10.0
    }  # fmt: skip
