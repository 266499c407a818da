"""Load in place: one builtin server loads checkpoint after checkpoint of one training run and answers exactly as
fresh servers do; what it serves is what it reports; only its owner may ask; another architecture is refused and
a failed load serves nothing. Real checkpoints (three saves of one run, written by megatron-core: tests/support/
corpus/training_run.py), real servers, real HTTP."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ckpteval.checkpoint.identity import content_identity
from ckpteval.server.identity import CHECKPOINT_HEADER, DEPLOYMENT_HEADER
from ckpteval.server.inplace_client import LOAD_ROUTE, load_dir_options, load_in_place
from ckpteval.server.launch import LocalServer, start_local_server
from tests.deploy_support import SERVER_START_TIMEOUT, free_port, request_json
from tests.support.corpus import built_once
from tests.support.corpus.edit import with_args
from tests.support.corpus.training_run import build_training_run

# what each checkpoint is asked: log-likelihoods with the top alternatives (echo) and greedy generations; asked
# twice, so the second time comes from the prefix cache (which a load must drop: its entries are the old weights')
PROMPTS = ("The quick brown fox", "Once upon a time, there", "1 + 1 = 2, 2 + 2 =")


@pytest.fixture(scope="session")
def three_saves(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = lambda root: {"run": build_training_run(root / "run", steps=3)}  # noqa: E731
    return built_once(tmp_path_factory, "training-run-3", build)["run"]


def _start(checkpoint: Path, tmp_path: Path, *, load_dir: Path | None = None, identity: str = "fresh") -> LocalServer:
    extra: dict[str, Any] = load_dir_options(load_dir) if load_dir is not None else {}
    return start_local_server(
        checkpoint=checkpoint,
        port=free_port(),
        device="cpu",
        identity=identity,
        log_path=tmp_path / f"server-{checkpoint.name}-{identity}.log",
        timeout=SERVER_START_TIMEOUT,
        **extra,
    )


def _post(url: str, body: Any) -> tuple[int, Any, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}"), error.headers


def _answers(url: str) -> tuple[list[Any], set[str]]:
    """Every answer's choices (ids and timestamps left out), and the checkpoint contents the answers named."""
    answers, named = [], set()
    for _ in range(2):
        for prompt in PROMPTS:
            for body in (
                {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 3},
                {"prompt": prompt, "max_tokens": 12, "temperature": 0},
            ):
                status, payload, headers = _post(url + "/v1/completions", body)
                assert status == 200, payload
                answers.append(payload["choices"])
                named.add(headers[CHECKPOINT_HEADER])
    return answers, named


def _health(url: str) -> tuple[int, Any]:
    return request_json("GET", url + "/v1/health")


def test_one_server_loading_three_saves_in_place_answers_as_three_fresh_servers(
    three_saves: Path, tmp_path: Path
) -> None:
    saves = [three_saves / f"iter_000000{i}" for i in (1, 2, 3)]
    contents = [content_identity(s).sha256 for s in saves]
    assert len(set(contents)) == 3
    load_dir = tmp_path / "load"
    in_place: list[list[Any]] = []
    with _start(saves[0], tmp_path, load_dir=load_dir, identity="inv-1") as kept:
        assert (load_dir / "secret").stat().st_mode & 0o077 == 0  # its owner's only
        for i, save in enumerate(saves):
            if i:
                answer = load_in_place(load_dir, str(save), identity=f"inv-{i + 1}")
                assert answer.loaded and answer.weights_read, answer.message
                assert answer.checkpoint is not None and answer.checkpoint["in_place"] is True
            status, health = _health(kept.url)
            assert status == 200 and health["deployment"] == f"inv-{i + 1}"
            assert health["checkpoint"]["content"]["sha256"] == contents[i]
            assert health["checkpoint"]["path"] == str(save)
            answers, named = _answers(kept.url)
            assert named == {contents[i]}  # every answer names what answered it
            in_place.append(answers)
    assert in_place[0] != in_place[1] != in_place[2]  # different weights, different answers
    for i in (1, 2):
        with _start(saves[i], tmp_path) as fresh:
            answers, named = _answers(fresh.url)
        assert named == {contents[i]}
        assert answers == in_place[i], f"iteration {i + 1}: loaded in place != fresh server"


def _client_of(url: str, *, identity: str, first_answer: str, output: Path) -> subprocess.CompletedProcess[str]:
    """A task client of invocation `identity` whose first answer named `first_answer`, sending one more request
    to `url` and checking its answer with the harness hook's own check (as the harness runs it)."""
    from ckpteval.tasks.client import hook_dir

    client = f"""
import json, sys, urllib.request
sys.path.insert(0, {hook_dir()!r})
import ckpteval_responses as hook
recorder = hook.Recorder({str(output)!r})
recorder.checkpoint = {first_answer!r}
body = json.dumps({{"prompt": "ab", "max_tokens": 2}}).encode()
request = urllib.request.Request({url + "/v1/completions"!r}, data=body, headers={{"Content-Type": "application/json"}})
with urllib.request.urlopen(request) as response:
    recorder.check_answer(response.headers)
print("scored")
"""
    env = {"CKPTEVAL_DEPLOYMENT_IDENTITY": identity, "CKPTEVAL_ANSWERS_NAMED": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", client], capture_output=True, text=True, env=env, timeout=120)


def test_only_the_owner_loads_a_late_client_is_refused_another_architecture_too_and_a_failed_load_serves_nothing(
    three_saves: Path, tmp_path: Path
) -> None:
    first, second, third = (three_saves / f"iter_000000{i}" for i in (1, 2, 3))
    other = with_args(three_saves, tmp_path / "other", num_layers=1)  # same tokenizer, another architecture
    corrupt = Path(shutil.copytree(three_saves, tmp_path / "corrupt"))
    for shard in (corrupt / "iter_0000002").glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])  # a save cut short
    load_dir = tmp_path / "load"
    with _start(first, tmp_path, load_dir=load_dir, identity="inv-1") as kept:
        served = content_identity(first).sha256

        # without the secret (whoever reaches the port), or with a wrong one: refused, nothing changes
        status, body, _ = _post(kept.url + LOAD_ROUTE, {"checkpoint": str(second), "identity": "intruder"})
        assert status == 403 and "load secret" in body["error"]["message"]
        secret_file = load_dir / "secret"
        good = secret_file.read_text()
        secret_file.write_text("0" * 64)
        assert load_in_place(load_dir, str(second), identity="intruder").status == 403
        secret_file.write_text(good)
        assert _health(kept.url)[1]["deployment"] == "inv-1"

        # another architecture: refused before anything is touched, the server serves what it did
        refused = load_in_place(load_dir, str(other / "iter_0000001"), identity="inv-x")
        assert refused.status == 409 and not refused.loaded
        assert any(r.startswith("another architecture (") and "num_layers" in r for r in refused.refused), (
            refused.refused
        )
        assert "fresh deployment" in refused.message
        status, health = _health(kept.url)
        assert status == 200 and health["deployment"] == "inv-1" and health["checkpoint"]["content"]["sha256"] == served

        # a request in flight when a load comes is answered first, with the weights and identity it began with
        slow: dict[str, Any] = {}

        def generate() -> None:
            slow["status"], slow["body"], slow["headers"] = _post(
                kept.url + "/v1/completions", {"prompt": "Once", "max_tokens": 200, "temperature": 0}
            )

        rows = request_json("GET", kept.url + "/v1/stats")[1]["generation_rows"]
        worker = threading.Thread(target=generate)
        worker.start()
        while request_json("GET", kept.url + "/v1/stats")[1]["generation_rows"] == rows:  # it is in
            time.sleep(0.01)
        loaded = load_in_place(load_dir, str(third), identity="inv-3")
        worker.join()
        assert loaded.loaded and slow["status"] == 200
        assert slow["headers"][CHECKPOINT_HEADER] == served and slow["headers"][DEPLOYMENT_HEADER] == "inv-1"

        # between two loads, a task client of the previous invocation sends one more request: the answer names
        # another deployment and content, and the client stops (exit 3) before anything is scored
        late = _client_of(kept.url, identity="inv-1", first_answer=served, output=tmp_path / "client")
        assert late.returncode == 3 and "scored" not in late.stdout, late.stdout + late.stderr
        assert "the endpoint changed mid-task" in late.stderr and "not this job's inv-1" in late.stderr
        current = _client_of(
            kept.url, identity="inv-3", first_answer=content_identity(third).sha256, output=tmp_path / "client3"
        )
        assert current.returncode == 0 and "scored" in current.stdout, current.stderr  # the new one's own client

        # a corrupt save: the load fails and the server serves nothing, neither the old weights nor a mix
        failed = load_in_place(load_dir, str(corrupt / "iter_0000002"), identity="inv-4")
        assert failed.status == 500 and not failed.loaded and "failed" in failed.message
        status, health = _health(kept.url)
        assert status == 503 and health["status"] == "failed" and "checkpoint" not in health
        status, body, headers = _post(kept.url + "/v1/completions", {"prompt": "ab", "max_tokens": 2})
        assert status == 503 and CHECKPOINT_HEADER not in headers and "loading one failed" in body["error"]["message"]

        # a good load afterwards serves again: the save held before the failure is read whole again, not taken
        # for the checkpoint the (half-overwritten) model still holds
        again = load_in_place(load_dir, str(third), identity="inv-5")
        assert again.loaded and again.weights_read
        status, health = _health(kept.url)
        assert status == 200 and health["checkpoint"]["content"]["sha256"] == content_identity(third).sha256
        # the checkpoint it holds, asked again: only the identity changes
        same = load_in_place(load_dir, str(third), identity="inv-6")
        assert same.loaded and not same.weights_read and _health(kept.url)[1]["deployment"] == "inv-6"
