"""The job's export step (`python -m ckpteval.hfexport cached`) on the tiny checkpoint megatron-core wrote: the
first run exports into the cache and links the export, a second finds it (0 tensors written, the parity kept), a
concurrent one waits for the entry's lock, a cache entry that no longer computes what the checkpoint computes is
refused in one line naming the tensor (exit 3, nothing linked), and a dry run finds the entry by the
checkpoint's file listing."""

from __future__ import annotations

import fcntl
import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from ckpteval.hfexport.__main__ import REFUSED, main
from ckpteval.hfexport.cache import export_into_cache


@pytest.fixture(scope="module")
def first(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The tiny checkpoint exported into a fresh cache by the step's command line, as a job runs it."""
    root = tmp_path_factory.mktemp("export-cache")
    report = root / "job1" / "state" / "hf_export.json"
    argv = [
        "cached",
        str(tiny_checkpoint),
        "--cache",
        str(root / "hf-exports"),
        "--link",
        str(root / "job1" / "hf_export"),
    ]
    assert main([*argv, "--report", str(report)]) == 0
    return root, json.loads(report.read_text())


def test_the_first_run_exports_checks_and_links(first: tuple[Path, dict], tiny_checkpoint: Path) -> None:
    root, report = first
    assert report["kind"] == "exported" and report["tensors_written"] > 0
    served = Path(report["served"])
    assert served.parent == root / "hf-exports" and served.name.startswith(report["identity"].split(":")[-1])
    assert (root / "job1" / "hf_export").resolve() == served
    assert (served / "config.json").is_file() and (served / "ckpteval_parity.json").is_file()
    assert report["parity"]["passed"] and report["parity"]["tensors_compared"] == report["tensors_written"]
    assert report["checkpoint"] == str(tiny_checkpoint / "iter_0000000")


def test_a_later_run_reuses_the_export_and_its_parity(first: tuple[Path, dict], tiny_checkpoint: Path) -> None:
    root, report = first
    notes: list[str] = []
    again = export_into_cache(
        tiny_checkpoint, root / "hf-exports", link=root / "job2" / "hf_export", on_note=notes.append
    )
    assert (again.kind, again.tensors_written, again.served) == ("reused", 0, report["served"])
    assert again.export is not None and again.export["parity_reused"] and again.export["parity"]["passed"]
    assert (root / "job2" / "hf_export").resolve() == Path(report["served"])
    assert any("0 of" in n and "parity kept" in n for n in notes), notes


def test_a_concurrent_run_waits_for_the_lock(first: tuple[Path, dict], tiny_checkpoint: Path) -> None:
    root, report = first
    lock = root / "hf-exports" / f"{Path(report['served']).name}.lock"
    notes: list[str] = []
    done: list[object] = []
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another job, exporting this checkpoint
        worker = threading.Thread(
            target=lambda: done.append(
                export_into_cache(
                    tiny_checkpoint, root / "hf-exports", link=root / "job3" / "hf_export", on_note=notes.append
                )
            )
        )
        worker.start()
        deadline = time.monotonic() + 120
        while not any("waiting for it" in n for n in notes) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert any("another job is exporting this checkpoint" in n for n in notes), notes
        time.sleep(1.0)
        assert not done  # still waiting
        fcntl.flock(held, fcntl.LOCK_UN)
    worker.join(timeout=120)
    (result,) = done
    assert result.kind == "reused" and result.tensors_written == 0 and result.waited_s >= 1.0


def test_an_export_that_no_longer_matches_is_refused_naming_the_tensor(
    first: tuple[Path, dict], tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file, save_file

    root, report = first
    cache = tmp_path / "cache"
    shutil.copytree(root / "hf-exports", cache, ignore=shutil.ignore_patterns("*.lock"))
    entry = cache / Path(report["served"]).name
    (entry / "ckpteval_parity.json").unlink()  # its check is not kept: it is checked again
    tensors = load_file(str(entry / "model.safetensors"))
    tensors["model.norm.weight"][0] += 0.25
    save_file(tensors, str(entry / "model.safetensors"), metadata={"format": "pt"})

    link = tmp_path / "job" / "hf_export"
    argv = ["cached", str(tiny_checkpoint), "--cache", str(cache), "--link", str(link)]
    assert main([*argv, "--report", str(tmp_path / "report.json")]) == REFUSED
    errors = [line for line in capsys.readouterr().out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, errors
    assert "does not compute what" in errors[0] and "tensors: differ: model.norm.weight (max |diff| 0.25)" in errors[0]
    assert not link.exists() and not (tmp_path / "report.json").exists()  # the engine gets nothing to serve


def test_a_dry_run_finds_the_export_by_the_checkpoint_s_listing(
    first: tuple[Path, dict], tiny_checkpoint: Path
) -> None:
    from ckpteval.checkpoint.description import describe_checkpoint
    from ckpteval.cluster.remote import LocalRemote
    from ckpteval.config.compile import compile_config
    from ckpteval.config.compose import CompileRequest
    from ckpteval.job.hf_export import export_status

    root, _report = first
    description = describe_checkpoint(tiny_checkpoint)
    for cache_dir, expected in ((root, "cached: "), (root / "elsewhere", "not cached: ")):
        compiled = compile_config(
            CompileRequest(
                configs=("tiny",),
                tasks=("hellaswag",),
                overrides=(
                    f"run.model={tiny_checkpoint}",
                    "deployment.prepare=null",
                    f"execution.cache_dir={cache_dir}",
                ),
            )
        )
        status = export_status(compiled, description, LocalRemote())
        assert status.startswith(expected), status


def test_a_hugging_face_directory_is_linked_as_it_is(first: tuple[Path, dict], tmp_path: Path) -> None:
    _, report = first
    hf_dir = Path(report["served"])
    result = export_into_cache(hf_dir, tmp_path / "cache", link=tmp_path / "hf_export")
    assert (result.kind, result.served) == ("huggingface", str(hf_dir))
    assert (tmp_path / "hf_export").resolve() == hf_dir and not (tmp_path / "cache").exists()


def test_results_json_names_the_checkpoint_the_export_step_read_and_the_export_served(
    first: tuple[Path, dict], tiny_checkpoint: Path
) -> None:
    """vLLM/SGLang on a Megatron checkpoint: results.json's checkpoint is what the job's export step hashed and
    the export the engine served (its cache key, its parity), not the description made before submission."""
    from types import SimpleNamespace

    import yaml

    from ckpteval.checkpoint.description import describe_checkpoint
    from ckpteval.checkpoint.identity import content_identity
    from ckpteval.job.files import checked_checkpoint
    from ckpteval.results.caveats import caveats
    from ckpteval.results.collect import collect_results
    from ckpteval.results.provenance import provenance_summary
    from ckpteval.results.store import read_results, write_results

    root, report = first
    job = root / "job1"
    no_flags = SimpleNamespace(config=SimpleNamespace(deployment=SimpleNamespace()))
    planned = checked_checkpoint(describe_checkpoint(tiny_checkpoint), no_flags)  # type: ignore[arg-type]
    (job / "job.yaml").write_text(yaml.safe_dump({**planned, "deployment": {"kind": "vllm"}}))

    results = read_results(write_results(job, collect_results(job, [], invocation="i1", created="t", model=None)))
    checkpoint = results.provenance.checkpoint  # type: ignore[union-attr]
    assert (checkpoint["source"], checkpoint["verified"]) == ("export step", True)
    assert checkpoint["files_sha256"] == content_identity(tiny_checkpoint / "iter_0000000").sha256
    assert checkpoint["path"] == str(tiny_checkpoint / "iter_0000000") and checkpoint["iteration"] == 0
    assert checkpoint["mismatch"] == [] and checkpoint["planned"]["listing_sha256"]
    served_as = checkpoint["served_as"]
    assert served_as["engine_reads"] == report["served"] == str(root / "hf-exports" / served_as["cache_key"])
    assert served_as["written"] == "exported" and served_as["tensors_written"] == report["tensors_written"]
    assert served_as["parity"]["passed"] and served_as["parity"]["greedy_identical"]
    assert served_as["parity"]["max_abs_logit_diff"] <= served_as["parity"]["tolerance"]
    assert "checkpoint not reported" not in [c.kind for c in caveats(results)]
    line = provenance_summary(results.provenance)["checkpoint"]
    assert f"content {checkpoint['files_sha256'][:12]}, served as export {served_as['cache_key'][:12]}" in line
    assert line.endswith("parity passed")

    # a job of the builtin server, or one whose step left no report: as before
    (job / "state" / "hf_export.json").rename(job / "state" / "hf_export.json.bak")
    try:
        described = collect_results(job, [], invocation="i1", created="t", model=None).provenance.checkpoint
    finally:
        (job / "state" / "hf_export.json.bak").rename(job / "state" / "hf_export.json")
    assert described["source"] == "description before submission" and not described["verified"]  # type: ignore[index]
