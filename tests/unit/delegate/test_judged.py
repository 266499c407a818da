"""The delegate's judge: set on its server (its overrides, env.toml's named judges), checked as it starts,
and a judged benchmark asked of a delegate without one answered 400 in one line over real HTTP, before
anything is evaluated."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ckpteval.delegate.server import make_server
from ckpteval.delegate.service import DelegateSettings, judge_summary
from ckpteval.errors import ConfigError

JUDGE = ("judge=api", "judge.url=https://judge.example/v1", "judge.model_id=judge-70b")


def test_the_judge_is_read_from_the_delegates_overrides_and_env_toml(
    write_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert judge_summary(DelegateSettings(output_root=tmp_path)).startswith("none (a judged benchmark is refused")
    assert judge_summary(DelegateSettings(output_root=tmp_path, overrides=JUDGE)) == (
        "api judge-70b at https://judge.example/v1"
    )
    assert judge_summary(DelegateSettings(output_root=tmp_path, overrides=("judge=self",))).startswith("self")
    env = write_env(
        '[judges.j]\ntype = "api"\nurl = "http://j/v1"\nmodel_id = "jm"\napi_key_name = "DELEGATE_JUDGE_KEY"\n'
    )
    settings = DelegateSettings(output_root=tmp_path, overrides=("judge=j",), env_file=env)
    with pytest.raises(ConfigError, match=r"\$DELEGATE_JUDGE_KEY is not set where the delegate runs"):
        judge_summary(settings)
    monkeypatch.setenv("DELEGATE_JUDGE_KEY", "s3cret")
    assert judge_summary(settings) == "api jm at http://j/v1"


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_judged_benchmark_without_a_judge_is_answered_400_in_one_line(isolated_user: Path, tmp_path: Path) -> None:
    server = make_server(DelegateSettings(output_root=tmp_path / "out"), host="127.0.0.1", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/evaluate"
        body = {"rollout_id": 1, "router_url": "http://127.0.0.1:9/", "benchmarks": [{"name": "mtbench"}]}
        status, answer = _post(url, body)
    finally:
        server.shutdown()
        server.server_close()
    assert status == 400
    assert "mtbench is scored by a judge model and no judge is set" in answer["error"]
    assert "\n" not in answer["error"]  # one line (the judged-task refusal has no hint)
    assert not list((tmp_path / "out").rglob("job.sh"))  # nothing was planned, nothing asked of the router
