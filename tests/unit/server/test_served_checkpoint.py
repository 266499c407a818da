"""The server is the source of truth: a job serves the iteration it described (pinned), whatever the tracker
names when the server loads, and the server reports what it loaded (its content identity, not only names and
sizes) in a file, in /v1/health and on every response. Real checkpoints: two saves of one training run
written by megatron-core (tests/support/corpus/training_run.py), a real server."""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import urllib.request
from pathlib import Path

import pytest

from ckpteval.checkpoint.identity import FULL, SAMPLED, content_identity
from ckpteval.errors import DeploymentError
from tests.support.corpus import built_once
from tests.support.corpus.training_run import build_training_run, set_tracker


@pytest.fixture(scope="session")
def training_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, "training-run", lambda root: {"run": build_training_run(root / "run")})["run"]


@pytest.fixture
def run_copy(training_run: Path, tmp_path: Path) -> Path:
    """A copy the test may move the tracker of."""
    return Path(shutil.copytree(training_run, tmp_path / "run"))


def test_two_saves_of_one_run_differ_in_content_though_not_in_names_and_sizes(training_run: Path) -> None:
    from ckpteval.checkpoint.description import describe_checkpoint

    first, second = (describe_checkpoint(training_run / f"iter_000000{i}").identity for i in (1, 2))
    assert first is not None and second is not None
    assert first.listing_sha256 == second.listing_sha256  # what files_sha256 was: it could not tell them apart
    one, two = content_identity(training_run / "iter_0000001"), content_identity(training_run / "iter_0000002")
    assert one.method == FULL and one.bytes_read == one.total_bytes
    assert one.sha256 != two.sha256 and one.files["__0_0.distcp"] != two.files["__0_0.distcp"]
    # sampled (what a checkpoint above FULL_HASH_LIMIT gets): still different
    one_s, two_s = (content_identity(training_run / f"iter_000000{i}", full_limit=0) for i in (1, 2))
    assert one_s.method == SAMPLED and one_s.sha256 != two_s.sha256
    assert content_identity(training_run / "iter_0000001", full_limit=0).sha256 == one_s.sha256  # deterministic


def test_a_sampled_shard_detects_a_new_save_and_a_new_size_not_an_edit_between_its_samples(tmp_path: Path) -> None:
    """What the sampled identity does and does not see, on a 64 MiB shard (read: 1/8 of it)."""
    import random

    iter_dir = tmp_path / "iter_0000001"
    iter_dir.mkdir()
    shard = iter_dir / "__0_0.distcp"
    data = bytearray(random.Random(1).randbytes(64 * 1024**2))
    shard.write_bytes(data)
    base, whole = content_identity(iter_dir, full_limit=0), content_identity(iter_dir)
    assert base.method == SAMPLED and base.bytes_read == 2 * 1024**2 + 62 * 64 * 1024
    data[len(data) // 2 + 100_000] ^= 1  # one byte between two samples: not seen
    shard.write_bytes(data)
    assert content_identity(iter_dir, full_limit=0).sha256 == base.sha256
    assert content_identity(iter_dir).sha256 != whole.sha256  # the whole-file hash sees it
    data[5] ^= 1  # in the first MiB (where every shard's header and first tensors are)
    shard.write_bytes(data)
    assert content_identity(iter_dir, full_limit=0).sha256 != base.sha256
    shard.write_bytes(random.Random(2).randbytes(64 * 1024**2))  # another save: every weight moved
    assert content_identity(iter_dir, full_limit=0).sha256 != base.sha256


def test_a_pinned_iteration_is_read_whatever_the_tracker_says_and_a_gone_one_is_refused(run_copy: Path) -> None:
    from ckpteval.checkpoint.layout import locate_checkpoint

    assert locate_checkpoint(run_copy).iteration == 2
    assert locate_checkpoint(run_copy, pinned="1").iter_dir.name == "iter_0000001"
    shutil.rmtree(run_copy / "iter_0000001")  # the training's retention deleted it while the job waited
    with pytest.raises(DeploymentError) as gone:
        locate_checkpoint(run_copy, pinned="1")
    assert "serves iteration 1" in gone.value.message and "no longer exists" in gone.value.message
    assert "now names 2" in gone.value.message
    with pytest.raises(DeploymentError, match="pinned iteration 1"):
        locate_checkpoint(run_copy / "iter_0000002", pinned="1")


def test_the_tracker_moves_between_plan_and_serve_and_the_planned_iteration_is_served(
    run_copy: Path, isolated_user: Path, tmp_path: Path
) -> None:
    """Planned at iteration 1; a save moves the tracker to 2 before the server starts: the server loads 1 (the
    job script passes it), reports it with its content identity, and names that content on every answer."""
    from ckpteval.api import compile_config
    from ckpteval.execution.pipeline import plan_job
    from ckpteval.server.identity import CHECKPOINT_HEADER, DEPLOYMENT_HEADER
    from ckpteval.server.launch import start_local_server
    from ckpteval.server.options import ServeOptions
    from ckpteval.server.runtime import free_port

    set_tracker(run_copy, 1)
    compiled = compile_config(
        configs=["tiny"], tasks=["adlr_mmlu"], overrides=["deployment.prepare=null", f"run.model={run_copy}"]
    )
    prepared = plan_job(compiled, "pin00001")
    prepared.check_checkpoint()
    step = prepared.plan.deployment.step
    assert step is not None and prepared.plan.deployment.pinned_iteration == "1"
    argv = shlex.split(step.command.removeprefix("exec "))
    assert argv[argv.index("--iteration") + 1] == "1"

    set_tracker(run_copy, 2)  # the training saved while the job waited in the queue
    planned = ServeOptions.from_argv(argv[argv.index("serve") + 1 :])
    report_file = tmp_path / "served_checkpoint.json"
    options = dataclasses.replace(
        planned, port=free_port(), port_file=None, port_fallback=False, publish_tokenizer=None, report_file=report_file
    )
    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    with start_local_server(log_path=tmp_path / "server.log", timeout=300, **fields) as server:
        report = json.loads(report_file.read_text())
        with urllib.request.urlopen(server.url + "/v1/health") as response:
            health = json.loads(response.read())
        request = urllib.request.Request(
            server.url + "/v1/completions",
            data=json.dumps({"prompt": "ab", "max_tokens": 2}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request) as response:
            headers = response.headers
    served = content_identity(run_copy / "iter_0000001")
    assert report["iteration"] == "1" and report["pinned"] == "1" and report["path"].endswith("iter_0000001")
    assert report["content"]["sha256"] == served.sha256 != content_identity(run_copy / "iter_0000002").sha256
    assert report["architecture"]["num_layers"] > 0 and report["device"] == "cpu"
    assert health["checkpoint"] == report and health["deployment"] == planned.identity
    assert headers[CHECKPOINT_HEADER] == served.sha256 and headers[DEPLOYMENT_HEADER] == planned.identity
