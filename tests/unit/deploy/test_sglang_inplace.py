"""SGLang loads the next checkpoint in place: the export of each save of one training run (written by
megatron-core: tests/support/corpus/training_run.py) posted to one running SGLang's `/update_weights_from_disk`
(`ckpteval.deploy.sglang_inplace`) answers exactly as a fresh SGLang on that export; the identity it reports (its
weight version) is the invocation's; a task client of the previous invocation is refused by the identity check;
an export of another architecture or tokenizer is refused before SGLang is asked; a failed load leaves nothing
served under the new identity. SGLang is the stand-in (tests/support/sglang_standin.py): transformers, with
SGLang's routes and its load from disk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckpteval.deploy.sglang_inplace import PORT_FILE, load_export, model_info
from ckpteval.errors import DeploymentError
from tests.deploy_support import request_json
from tests.support.corpus import built_once
from tests.support.corpus.training_run import build_training_run
from tests.support.sglang_standin import start

PROMPTS = ("The quick brown fox", "Once upon a time, there", "1 + 1 = 2, 2 + 2 =")


@pytest.fixture(scope="session")
def three_saves(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = lambda root: {"run": build_training_run(root / "run", steps=3)}  # noqa: E731
    return built_once(tmp_path_factory, "training-run-3", build)["run"]


@pytest.fixture(scope="module")
def exports(three_saves: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from ckpteval.hfexport.write import export_checkpoint

    root = tmp_path_factory.mktemp("sglang-exports")
    return [export_checkpoint(three_saves / f"iter_000000{i}", root / f"hf-{i}").output for i in (1, 2, 3)]


class Kept:
    """A running SGLang stand-in and its load directory (`<dir>/port`, as `evaluate watch` writes it)."""

    def __init__(self, export: Path, work: Path, weight_version: str) -> None:
        self.process, self.url = start(export, work, weight_version=weight_version)
        self.load_dir = work / "load"
        self.load_dir.mkdir()
        (self.load_dir / PORT_FILE).write_text(self.url.rsplit(":", 1)[1] + "\n")

    def __enter__(self) -> Kept:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _answers(url: str) -> list[Any]:
    """Log-likelihoods (echo) and greedy generations of every prompt."""
    out = []
    for prompt in PROMPTS:
        for body in ({"echo": True, "logprobs": 1, "max_tokens": 1}, {"max_tokens": 6}):
            status, answer = request_json(
                "POST", url + "/v1/completions", {"model": "model", "prompt": prompt, "temperature": 0, **body}
            )
            assert status == 200, answer
            choice = answer["choices"][0]
            out.append((choice["text"], (choice["logprobs"] or {}).get("token_logprobs")))
    return out


def test_one_sglang_loads_the_next_exports_in_place_and_answers_as_fresh_ones(
    exports: list[Path], tmp_path: Path
) -> None:
    in_place = []
    with Kept(exports[0], tmp_path / "kept", "inv-1") as kept:
        for i, export in enumerate(exports):
            if i:
                loaded = load_export(kept.load_dir, export, identity=f"inv-{i + 1}")
                assert "Succeeded to update model weights" in loaded.message
            info = model_info(kept.url)
            assert info["weight_version"] == f"inv-{i + 1}" and Path(info["model_path"]) == export.resolve()
            in_place.append(_answers(kept.url))
    assert in_place[0] != in_place[1] != in_place[2]  # different weights, different answers
    process, url = start(exports[2], tmp_path / "fresh", weight_version="fresh")
    try:
        assert _answers(url) == in_place[2], "loaded in place != a fresh SGLang on the same export"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _client_of(url: str, *, identity: str, output: Path) -> subprocess.CompletedProcess[str]:
    """A task client of invocation `identity` sending one request to `url`: first the check before its first
    request (ckpteval_wait_ready, on /get_model_info), then the harness hook's check of the answer."""
    from ckpteval.tasks.client import hook_dir

    client = f"""
import json, sys, urllib.request
sys.path.insert(0, {hook_dir()!r})
import ckpteval_responses as hook, ckpteval_wait_ready as ready
print("before:", ready.identity_problem(), flush=True)
recorder = hook.Recorder({str(output)!r})
body = json.dumps({{"model": "model", "prompt": "ab", "max_tokens": 2}}).encode()
request = urllib.request.Request({url + "/v1/completions"!r}, data=body, headers={{"Content-Type": "application/json"}})
with urllib.request.urlopen(request) as response:
    recorder.check_answer(response.headers, json.loads(response.read()))
print("scored")
"""
    env = {
        "CKPTEVAL_DEPLOYMENT_IDENTITY": identity,
        "CKPTEVAL_DEPLOYMENT_IDENTITY_URL": url + "/get_model_info",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run([sys.executable, "-c", client], capture_output=True, text=True, env=env, timeout=120)


def test_another_model_is_refused_a_late_client_too_and_a_failed_load_serves_nothing_under_the_new_identity(
    exports: list[Path], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    wider = Path(shutil.copytree(exports[1], tmp_path / "wider"))
    config = json.loads((wider / "config.json").read_text())
    config["intermediate_size"] += 8
    (wider / "config.json").write_text(json.dumps(config))
    retokenized = Path(shutil.copytree(exports[1], tmp_path / "retokenized"))
    tokenizer_config = json.loads((retokenized / "tokenizer_config.json").read_text())
    (retokenized / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "model_max_length": 7}))
    corrupt = Path(shutil.copytree(exports[2], tmp_path / "corrupt"))
    for file in corrupt.glob("*.safetensors"):  # one tensor a row short: SGLang's loader fails on its shape
        tensors = load_file(str(file))
        name = next(n for n in sorted(tensors) if n.endswith("mlp.down_proj.weight"))
        tensors[name] = tensors[name][:-1].contiguous()
        save_file(tensors, str(file), metadata={"format": "pt"})

    with Kept(exports[0], tmp_path / "kept", "inv-1") as kept:
        # another architecture, another tokenizer: refused before SGLang is asked, it serves what it did
        with pytest.raises(DeploymentError) as refused:
            load_export(kept.load_dir, wider, identity="inv-x")
        assert "another architecture (intermediate_size" in refused.value.message
        assert refused.value.hint and "fresh deployment" in refused.value.hint
        with pytest.raises(DeploymentError, match="another tokenizer"):
            load_export(kept.load_dir, retokenized, identity="inv-x")
        assert model_info(kept.url)["weight_version"] == "inv-1"

        load_export(kept.load_dir, exports[1], identity="inv-2")
        # between two loads, a task client of the previous invocation is refused: before its first request
        # (/get_model_info names another weight version), and on an answer (its metadata names another)
        late = _client_of(kept.url, identity="inv-1", output=tmp_path / "client1")
        assert late.returncode == 3 and "scored" not in late.stdout, late.stdout + late.stderr
        assert "before: " in late.stdout and "answers for another deployment" in late.stdout
        assert "the endpoint changed mid-task" in late.stderr and "not this job's inv-1" in late.stderr
        current = _client_of(kept.url, identity="inv-2", output=tmp_path / "client2")
        assert current.returncode == 0 and "before: None" in current.stdout and "scored" in current.stdout

        # a failed load: SGLang answers success false (400), keeps its weight version: nothing is served under
        # the new identity, and the new invocation's clients are refused
        with pytest.raises(DeploymentError) as failed:
            load_export(kept.load_dir, corrupt, identity="inv-3")
        assert "HTTP 400" in failed.value.message and "Rolling back to original weights" in failed.value.message
        assert "still 'inv-2'" in failed.value.message
        assert model_info(kept.url)["weight_version"] == "inv-2"
        refused_client = _client_of(kept.url, identity="inv-3", output=tmp_path / "client3")
        assert refused_client.returncode == 3 and "scored" not in refused_client.stdout
        assert os.environ.get("CKPTEVAL_DEPLOYMENT_IDENTITY") is None  # the clients' identities stayed theirs
