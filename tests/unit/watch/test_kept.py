"""The watcher's kept deployment: when one deployment is kept across checkpoints (and why not), and, with a real
builtin server on saves of one training run written by megatron-core, that a checkpoint of another architecture
gets a fresh deployment (saying so) while the next save of the run is loaded in place."""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from pathlib import Path

import pytest

from ckpteval.api import compile_config
from ckpteval.watch.kept import KeptDeployment, keep_decision
from ckpteval.watch.state import WatchSpec
from tests.support.corpus import built_once
from tests.support.corpus.edit import with_args
from tests.support.corpus.training_run import build_training_run


@pytest.fixture(scope="session")
def three_saves(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = lambda root: {"run": build_training_run(root / "run", steps=3)}  # noqa: E731
    return built_once(tmp_path_factory, "training-run-3", build)["run"]


def _compiled(iter_dir: Path, *overrides: str):  # type: ignore[no-untyped-def]
    return compile_config(
        configs=["tiny"],
        tasks=["hellaswag"],
        overrides=[
            "deployment.prepare=null",
            f"run.model={iter_dir}",
            f"deployment.tokenizer={iter_dir.parent / 'tokenizer'}",
            *overrides,
        ],
    )


def test_one_deployment_is_kept_only_where_it_can_load_in_place(three_saves: Path, isolated_user: Path) -> None:
    spec = WatchSpec(save_dir=str(three_saves), configs=["tiny"], profile=None, tasks=["hellaswag"], overrides=[])
    config = _compiled(three_saves / "iter_0000001").config
    kept = keep_decision(dataclasses.replace(spec, max_pending=1), config, here=True)
    assert kept.keep and kept.line.startswith("one deployment kept across checkpoints, each loaded into it in place")
    why_not = {
        "--fresh-deployments": keep_decision(dataclasses.replace(spec, fresh_deployments=True), config, here=True),
        "--max-pending 2": keep_decision(dataclasses.replace(spec, max_pending=2), config, here=True),
        "its own job": keep_decision(dataclasses.replace(spec, max_pending=1), config, here=False),
        "several replicas": keep_decision(
            dataclasses.replace(spec, max_pending=1),
            _compiled(three_saves / "iter_0000001", "deployment.num_replicas=2").config,
            here=True,
        ),
    }
    for words, decision in why_not.items():
        assert not decision.keep and decision.line.startswith("a fresh deployment per checkpoint: ")
        assert words in decision.line, decision.line
    from ckpteval.deploy.backends import registered_backends

    # the builtin server (`POST /v1/load`) and SGLang (`/update_weights_from_disk`, `watch.kept_sglang`)
    assert {k for k, b in registered_backends().items() if b.loads_in_place} == {"megatron/builtin", "sglang"}


def test_another_architecture_gets_a_fresh_deployment_and_the_next_save_a_kept_one(
    three_saves: Path, isolated_user: Path, tmp_path: Path
) -> None:
    other = with_args(three_saves, tmp_path / "other", num_layers=1) / "iter_0000003"
    kept = KeptDeployment("run42-abc", lambda _i, iter_dir: _compiled(Path(iter_dir)))
    try:
        first = kept.place(1, str(three_saves / "iter_0000001"))
        assert first.load_into == str(kept.directory) and first.note.startswith(
            "iteration 1: started the kept deployment"
        )
        assert (kept.directory / "secret").stat().st_mode & 0o077 == 0
        server = kept.process
        assert server is not None and kept.running()

        refused = kept.place(3, str(other))
        assert refused.load_into is None
        assert refused.note.startswith("iteration 3: another architecture (num_layers") and refused.note.endswith(
            "than the kept deployment: a fresh deployment for it"
        )
        assert not kept.running() and server.poll() is not None  # stopped; the next one starts a new one

        again = kept.place(2, str(three_saves / "iter_0000002"))
        assert again.load_into == str(kept.directory) and "started the kept deployment" in again.note
        port = (kept.directory / "port").read_text().strip()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health") as response:
            health = json.loads(response.read())
        assert health["checkpoint"]["path"] == str(three_saves / "iter_0000002")
        assert health["deployment"] == "run42-abc-kept"  # no invocation's yet: each job loads under its own
    finally:
        kept.stop()
    assert not kept.running() and not (kept.directory / "server.pid").exists()
