"""Provenance: a checkpoint's identity (no weight read) tells checkpoints apart the same here and on a cluster,
and results.json records what produced its numbers: that identity, the tokenizer, the deployment, the endpoint
identity the job verified, the harness and each task's effective request settings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ckpteval.checkpoint.description import describe_checkpoint
from tests.support.corpus.edit import with_args

GOLDEN_MMLU = Path(__file__).parents[1] / "tasks" / "golden" / "mmlu_offline" / "artifacts"


def test_the_identity_changes_with_the_args_and_with_a_shard_not_with_a_copy(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    first = describe_checkpoint(tiny_checkpoint).identity
    assert first is not None and first.metadata_files == ("common.pt", "metadata.json", ".metadata")
    assert first.n_files >= 4 and first.total_bytes > 0
    copy = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint, copy)
    assert describe_checkpoint(copy).identity == first  # where it lies is not what it is
    retrained = with_args(tiny_checkpoint, tmp_path / "args", rotary_base=500000)
    other = describe_checkpoint(retrained).identity
    assert other is not None and other.metadata_sha256 != first.metadata_sha256
    shard = next((copy / "iter_0000000").glob("*.distcp"))
    with open(shard, "ab") as handle:  # one shard one byte longer: the weights are not read, their sizes are
        handle.write(b"\0")
    grown = describe_checkpoint(copy).identity
    assert grown is not None and grown.metadata_sha256 == first.metadata_sha256
    assert grown.listing_sha256 != first.listing_sha256 and grown.total_bytes == first.total_bytes + 1


def test_a_cluster_checkpoint_has_the_identity_it_has_here(tiny_checkpoint: Path) -> None:
    """Its small files and its file list come over the remote seam (here: a shell on this machine)."""
    from ckpteval.cluster.checkpoint_files import describe_remote_checkpoint
    from ckpteval.cluster.remote import LocalRemote

    here = describe_checkpoint(tiny_checkpoint)
    with LocalRemote() as remote:
        there = describe_remote_checkpoint(remote, str(tiny_checkpoint))
    assert there.identity == here.identity
    assert there.tokenizer is not None and here.tokenizer is not None
    assert there.tokenizer.sha256 == here.tokenizer.sha256 is not None


def test_results_json_records_what_produced_the_numbers(
    tiny_checkpoint: Path, isolated_user: Path, tmp_path: Path
) -> None:
    from ckpteval.api import compile_config
    from ckpteval.execution.pipeline import plan_job
    from ckpteval.invocation.jobdir import JobDir
    from ckpteval.job.files import job_files, write_job_files
    from ckpteval.results.collect import collect_results
    from ckpteval.results.store import read_results, write_results

    compiled = compile_config(
        configs=["tiny"], tasks=["adlr_mmlu"], overrides=["deployment.prepare=null", f"run.model={tiny_checkpoint}"]
    )
    prepared = plan_job(compiled, "abcd1234")
    prepared.check_checkpoint()
    assert prepared.description is not None

    job_dir = tmp_path / "job"
    write_job_files(job_dir, job_files(compiled, prepared.plan, launcher="processes", checkpoint=prepared.description))
    task = prepared.plan.tasks[0]
    shutil.copytree(GOLDEN_MMLU, job_dir / task.dir / "output")  # a real harness output (5-shot, 1 sample)
    (job_dir / JobDir.task_done(task.dir)).touch()
    tasks = [(task.name, task.dir)]

    results = collect_results(job_dir, tasks, invocation="abcd1234", created="now", model=str(tiny_checkpoint))
    p = results.provenance
    assert p is not None and results.tasks["adlr_mmlu"].status == "succeeded"
    identity = prepared.description.identity
    assert identity is not None and p.checkpoint is not None
    assert p.checkpoint["iteration"] == 0 and p.checkpoint["layout"] == "megatron-lm"
    assert p.checkpoint["metadata_sha256"] == identity.metadata_sha256
    assert p.checkpoint["listing_sha256"] == identity.listing_sha256
    # no report from the server (the job did not run): recorded as described, and said to be unverified
    assert p.checkpoint["source"] == "description before submission" and p.checkpoint["verified"] is False
    assert p.tokenizer is not None and p.tokenizer["sha256"] == prepared.description.tokenizer.sha256
    assert p.deployment["kind"] == "megatron/builtin" and "--checkpoint" in p.deployment["command"]
    assert p.deployment["versions"]["megatron-core"] != "not installed"
    assert p.deployment["prompt_tokens"] is None  # no deployment log (a server that never ran, or was killed)
    assert p.endpoint == {"identity": None, "verified": False, "note": "not verifiable", "owned": True}
    assert set(p.harness["versions"]) >= {"nemo-evaluator", "nvidia-lm-eval"}
    mmlu = p.tasks["adlr_mmlu"]
    assert mmlu["settings_from"] == "harness output" and mmlu["endpoint_type"] == "completions"
    assert mmlu["settings"]["extra"]["num_fewshot"] == 5 and mmlu["settings"]["limit_samples"] == 1
    assert mmlu["harness"]["git_hash"] == "10f8921"

    # once the job verified its endpoint (state/deployment_identity), results.json says which
    (job_dir / "state").mkdir(exist_ok=True)
    (job_dir / "state" / "deployment_identity").write_text("abcd1234-5f2e\n")
    write_results(job_dir, collect_results(job_dir, tasks, invocation="abcd1234", created="now", model=None))
    on_disk = json.loads((job_dir / JobDir.RESULTS).read_text())["provenance"]
    assert on_disk["endpoint"] == {"identity": "abcd1234-5f2e", "verified": True, "owned": True}

    # the builtin server's exit line: its prompt tokens, those computed, those its prefix cache served
    from ckpteval.server.scheduler import SchedulerStats
    from ckpteval.server.serve import prompt_summary

    stats = SchedulerStats()
    stats.count_prompts(1000, 250)
    (job_dir / "logs").mkdir(exist_ok=True)
    (job_dir / JobDir.DEPLOYMENT_LOG).write_text(f"Serving ...\nServer stopped.\n{prompt_summary(stats)}\n")
    write_results(job_dir, collect_results(job_dir, tasks, invocation="abcd1234", created="now", model=None))
    on_disk = json.loads((job_dir / JobDir.RESULTS).read_text())["provenance"]
    assert on_disk["deployment"]["prompt_tokens"] == {
        "prompt_tokens": 1000,
        "computed_tokens": 250,
        "cached_tokens": 750,
        "hit_rate": 0.75,
    }
    assert (
        read_results(job_dir / JobDir.RESULTS).provenance
        == collect_results(job_dir, tasks, invocation="abcd1234", created="now", model=None).provenance
    )


def test_the_published_tokenizer_is_hashed_as_served(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from ckpteval.results.provenance import read_provenance
    from ckpteval.server.checkpoint import publish_tokenizer

    publish_tokenizer(tiny_checkpoint, tmp_path / "tokenizer")
    p = read_provenance(tmp_path, [])
    assert p.tokenizer is not None
    assert p.tokenizer["served_sha256"] == describe_checkpoint(tiny_checkpoint).tokenizer.sha256  # type: ignore[union-attr]
