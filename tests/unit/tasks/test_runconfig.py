"""The run config: what nemo-evaluator renders from it is the launcher's command, with our adapter chain."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckpteval.errors import ConfigError
from ckpteval.tasks.catalog import load_catalog
from ckpteval.tasks.runconfig import (
    NO_PROXY_ADAPTER_CONFIG,
    EndpointSpec,
    TaskPaths,
    build_run_config,
    client_hook_env,
    default_adapter_config,
    harness_command,
    proxy_adapter_config,
    runs_through_proxy,
    write_run_config,
)

ENDPOINT = EndpointSpec(url="http://127.0.0.1:8000/v1/completions", model_id="megatron-model", type="completions")
USER = {
    "config": {"params": {"limit_samples": 5, "parallelism": 4, "extra": {"tokenizer": "/tok dir/smol"}}},
}


def launcher_config_ef(task: str, user: dict[str, Any], output_dir: str) -> dict[str, Any]:
    """What nemo-evaluator-launcher 0.2.6 writes as config_ef.yaml (helpers.get_eval_factory_command)."""
    cfg = copy.deepcopy(user)
    api = cfg.setdefault("target", {}).setdefault("api_endpoint", {})
    api.setdefault("url", ENDPOINT.url)
    api.setdefault("model_id", ENDPOINT.model_id)
    api.setdefault("type", ENDPOINT.type)
    cfg.setdefault("config", {}).setdefault("type", task)
    cfg["config"].setdefault("output_dir", output_dir)
    return cfg


def rendered_command(run_config: dict[str, Any]) -> str:
    """The harness command line nemo-evaluator renders (its own code, in-process)."""
    return harness_command(run_config)


@pytest.mark.parametrize("task", ["adlr_mmlu", "hellaswag", "gsm8k", "adlr_humaneval_greedy", "piqa"])
def test_rendered_harness_command_is_the_launchers(task: str) -> None:
    spec = load_catalog().get(task)
    ours = build_run_config(spec, USER, endpoint=ENDPOINT, output_dir="/results")
    theirs = launcher_config_ef(task, USER, "/results")
    assert rendered_command(ours) == rendered_command(theirs)
    command = rendered_command(ours)
    assert "--limit 5" in command and "num_concurrent=4" in command and "tokenizer=/tok dir/smol" in command


def test_nemo_evaluator_cli_dry_run_accepts_the_file(tmp_path: Path) -> None:
    spec = load_catalog().get("hellaswag")
    paths = TaskPaths(tmp_path / "tasks" / "hellaswag")
    run_config = build_run_config(spec, USER, endpoint=ENDPOINT, output_dir=str(paths.output_dir))
    write_run_config(run_config, paths.run_config)
    exe = Path(sys.executable).parent / "nemo-evaluator"
    done = subprocess.run(
        [str(exe), "run_eval", "--run_config", str(paths.run_config), "--dry_run"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    command = done.stdout.split("Rendered command:", 1)[1].strip()
    assert command.startswith("lm-eval --tasks hellaswag --num_fewshot 10 --model local-completions")
    assert f"--output_path {paths.output_dir} --use_cache {paths.output_dir}/lm_cache --limit 5" in command


def test_params_are_task_defaults_under_user_params() -> None:
    spec = load_catalog().get("adlr_mmlu")
    rc = build_run_config(spec, USER, endpoint=ENDPOINT, output_dir="/out")
    params = rc["config"]["params"]
    assert params["limit_samples"] == 5 and params["parallelism"] == 4  # user
    assert params["max_retries"] == spec.params["max_retries"] and params["task"] == "mmlu_str"  # task defaults
    # `extra` merges key by key: the user's tokenizer next to the task's few-shot count and args
    assert params["extra"]["tokenizer"] == "/tok dir/smol"
    assert params["extra"]["num_fewshot"] == 5 and params["extra"]["args"] == "--trust_remote_code"
    assert rc["config"]["type"] == "adlr_mmlu" and rc["config"]["output_dir"] == "/out"
    api = rc["target"]["api_endpoint"]
    assert (api["url"], api["model_id"], api["type"], api["api_key_name"]) == (
        ENDPOINT.url,
        "megatron-model",
        "completions",
        None,
    )
    assert api["stream"] is False  # the catalog's target default


CHAT = EndpointSpec(url="http://127.0.0.1:8000/v1/chat/completions", model_id="megatron-model", type="chat")


def test_lm_eval_tasks_run_without_the_proxy_and_the_hook_keeps_cache_progress_and_params() -> None:
    spec = load_catalog().get("gsm8k")
    rc = build_run_config(spec, {}, endpoint=ENDPOINT, output_dir="/out/artifacts", request_params={"seed": 2})
    adapter = rc["target"]["api_endpoint"]["adapter_config"]
    assert adapter == NO_PROXY_ADAPTER_CONFIG and not runs_through_proxy(adapter)  # no payload_modifier added
    assert client_hook_env(rc, {"seed": 2}) == {
        "CKPTEVAL_CLIENT_OUTPUT": "/out/artifacts",
        "CKPTEVAL_REQUEST_PARAMS": '{"seed": 2}',
    }
    assert client_hook_env(rc) == {"CKPTEVAL_CLIENT_OUTPUT": "/out/artifacts"}


def test_a_chain_of_the_users_runs_the_proxy_with_the_params_and_no_hook_env() -> None:
    spec = load_catalog().get("gsm8k")
    user = {"target": {"api_endpoint": {"adapter_config": {"interceptors": [{"name": "endpoint"}]}}}}
    rc = build_run_config(spec, user, endpoint=ENDPOINT, output_dir="/o", request_params={"seed": 1})
    names = [i["name"] for i in rc["target"]["api_endpoint"]["adapter_config"]["interceptors"]]
    assert names == ["payload_modifier", "endpoint"] and client_hook_env(rc, {"seed": 1}) == {}
    legacy = {"target": {"api_endpoint": {"adapter_config": {"use_caching": True}}}}
    assert runs_through_proxy(
        build_run_config(spec, legacy, endpoint=ENDPOINT, output_dir="/o")["target"]["api_endpoint"]["adapter_config"]
    )


def test_params_for_another_harness_with_every_interceptor_disabled_are_a_config_error() -> None:
    spec = load_catalog().get("AIME_2025")  # simple_evals: only the proxy can set a repeat's seed
    user = {"target": {"api_endpoint": {"adapter_config": NO_PROXY_ADAPTER_CONFIG}}}
    with pytest.raises(ConfigError, match="only nemo-evaluator's interceptor proxy can do that"):
        build_run_config(spec, user, endpoint=CHAT, output_dir="/o", request_params={"seed": 1})


def test_other_harnesses_keep_the_proxy_chain_that_caches_tracks_progress_and_caps_logging() -> None:
    spec = load_catalog().get("AIME_2025")
    rc = build_run_config(spec, {}, endpoint=CHAT, output_dir="/out/artifacts")
    assert client_hook_env(rc) == {}
    chain = {i["name"]: i.get("config", {}) for i in rc["target"]["api_endpoint"]["adapter_config"]["interceptors"]}
    assert list(chain)[:3] == ["request_logging", "caching", "endpoint"]
    assert chain["caching"]["cache_dir"] == "/out/artifacts/cache" and chain["caching"]["reuse_cached_responses"]
    assert chain["request_logging"]["max_requests"] == 2 and chain["response_logging"]["max_responses"] == 2
    progress = chain["progress_tracking"]
    assert progress["output_dir"] == "/out/artifacts" and progress["progress_tracking_interval_seconds"] == 0.5
    assert (
        progress["progress_tracking_url"] == "http://127.0.0.1:8000/v1/health" and progress["request_method"] == "GET"
    )


def test_nemo_evaluator_builds_the_interceptors_we_configure() -> None:
    # the proxy chain (other harnesses' default) on an lm-eval task: only its harness is installed here
    spec = load_catalog().get("hellaswag")
    user = {"target": {"api_endpoint": {"adapter_config": proxy_adapter_config("/out", ENDPOINT)}}}
    rc = build_run_config(spec, user, endpoint=ENDPOINT, output_dir="/out")
    from nemo_evaluator.core.input import validate_configuration

    adapter = validate_configuration(rc).target.api_endpoint.adapter_config
    assert [i.name for i in adapter.interceptors] == [
        "request_logging",
        "caching",
        "endpoint",
        "response_stats",
        "response_logging",
        "progress_tracking",
    ]
    from nemo_evaluator.adapters.interceptors.progress_tracking_interceptor import ProgressTrackingInterceptor

    # the parameters validate (a typo here would only fail when the proxy starts, inside the job)
    ProgressTrackingInterceptor.Params(**adapter.get_interceptor_configs()["progress_tracking"])


def test_user_adapter_chain_replaces_ours_and_other_keys_merge() -> None:
    spec = load_catalog().get("adlr_mmlu")
    own_chain = {"interceptors": [{"name": "endpoint"}]}
    rc = build_run_config(
        spec, {"target": {"api_endpoint": {"adapter_config": own_chain}}}, endpoint=ENDPOINT, output_dir="/o"
    )
    assert rc["target"]["api_endpoint"]["adapter_config"] == own_chain
    legacy = {"use_reasoning": True}
    rc = build_run_config(
        spec, {"target": {"api_endpoint": {"adapter_config": legacy}}}, endpoint=ENDPOINT, output_dir="/o"
    )
    assert rc["target"]["api_endpoint"]["adapter_config"] == legacy
    # other keys merge over the default chain: none for lm-eval tasks, the proxy chain for other harnesses
    other = load_catalog().get("AIME_2025")
    for task, endpoint, chain in (
        (spec, ENDPOINT, default_adapter_config(spec, "/o", ENDPOINT)),
        (other, CHAT, proxy_adapter_config("/o", CHAT)),
    ):
        user = {"target": {"api_endpoint": {"adapter_config": {"log_failed_requests": True}}}}
        adapter = build_run_config(task, user, endpoint=endpoint, output_dir="/o")["target"]["api_endpoint"][
            "adapter_config"
        ]
        assert adapter["log_failed_requests"] is True
        assert adapter["interceptors"] == chain["interceptors"]


def test_the_no_proxy_setting_starts_no_interceptor() -> None:
    spec = load_catalog().get("hellaswag")
    user = {"target": {"api_endpoint": {"adapter_config": NO_PROXY_ADAPTER_CONFIG}}}
    rc = build_run_config(spec, user, endpoint=ENDPOINT, output_dir="/out")
    from nemo_evaluator.core.input import validate_configuration

    adapter = validate_configuration(rc).target.api_endpoint.adapter_config
    # nemo-evaluator starts its proxy only if some interceptor or post-eval hook is enabled
    assert not [i for i in adapter.interceptors if i.enabled] and not adapter.post_eval_hooks


def test_health_url_override_and_api_key_name() -> None:
    endpoint = EndpointSpec(
        url="https://api.example.com/v1/completions",
        model_id="m",
        type="completions",
        api_key_name="MY_KEY",
        health_url="https://api.example.com/health",
    )
    rc = build_run_config(load_catalog().get("adlr_mmlu"), None, endpoint=endpoint, output_dir="/o")
    api = rc["target"]["api_endpoint"]
    assert api["api_key_name"] == "MY_KEY"
    assert "OPENAI_API_KEY=$MY_KEY lm-eval" in rendered_command(rc)
    # the proxy's progress heartbeat (another harness's task) goes to the health URL given
    chat = dataclasses.replace(endpoint, url="https://api.example.com/v1/chat/completions", type="chat")
    rc = build_run_config(load_catalog().get("AIME_2025"), None, endpoint=chat, output_dir="/o")
    api = rc["target"]["api_endpoint"]
    assert api["api_key_name"] == "MY_KEY"
    chain = {i["name"]: i.get("config", {}) for i in api["adapter_config"]["interceptors"]}
    assert chain["progress_tracking"]["progress_tracking_url"] == "https://api.example.com/health"


def test_bad_endpoint_type_and_relative_output_dir_are_config_errors() -> None:
    spec = load_catalog().get("hellaswag")  # completions only
    chat = EndpointSpec(url="http://h/v1/chat/completions", model_id="m", type="chat")
    with pytest.raises(ConfigError, match="supports completions endpoints, not chat"):
        build_run_config(spec, None, endpoint=chat, output_dir="/o")
    with pytest.raises(ConfigError, match="absolute path"):
        build_run_config(spec, None, endpoint=ENDPOINT, output_dir="relative/dir")


def test_write_run_config_replaces_atomically(tmp_path: Path) -> None:
    target = tmp_path / "t" / "run_config.yml"
    rc = build_run_config(load_catalog().get("hellaswag"), USER, endpoint=ENDPOINT, output_dir="/o")
    write_run_config(rc, target)
    write_run_config({**rc, "metadata": {"x": 1}}, target)
    assert yaml.safe_load(target.read_text())["metadata"] == {"x": 1}
    assert sorted(p.name for p in target.parent.iterdir()) == ["run_config.yml"]  # no temporary left behind


def test_task_paths_keep_our_run_config_out_of_the_output_dir(tmp_path: Path) -> None:
    paths = TaskPaths(tmp_path / "tasks" / "adlr_mmlu")
    # nemo-evaluator writes its own run_config.yml into the output dir: ours must live elsewhere
    assert paths.run_config.parent != paths.output_dir
    assert paths.output_dir == tmp_path / "tasks" / "adlr_mmlu" / "artifacts"
