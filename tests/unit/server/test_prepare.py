"""`prepare_checkpoint`: the layout Megatron-LM writes, the offline tokenizer, caching and atomic writes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from ckpteval.errors import DeploymentError
from ckpteval.server import prepare
from ckpteval.server.checkpoint import load_checkpoint_info, read_common_state
from ckpteval.server.packaged import TINY_ARCHITECTURE
from ckpteval.server.prepare import default_checkpoint_dir, ensure_prepared, prepare_checkpoint


def test_written_like_megatron_lm(tiny_checkpoint: Path) -> None:
    assert (tiny_checkpoint / "latest_checkpointed_iteration.txt").read_text() == "0"
    iter_dir = tiny_checkpoint / "iter_0000000"
    assert json.loads((iter_dir / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    common = read_common_state(iter_dir)
    assert common["checkpoint_version"] == 3.0 and common["iteration"] == 0
    args = common["args"]  # Megatron-LM's argument names, readable by its load_args_from_checkpoint
    assert (args.num_layers, args.hidden_size, args.num_attention_heads) == (2, 64, 4)
    assert args.swiglu is True and args.group_query_attention is True and args.num_query_groups == 2
    assert args.padded_vocab_size == 257 and args.untie_embeddings_and_output_weights is True


def test_architecture_and_tokenizer_are_recovered(tiny_checkpoint: Path) -> None:
    info = load_checkpoint_info(tiny_checkpoint / "iter_0000000")
    assert info.architecture == TINY_ARCHITECTURE
    assert info.tokenizer_dir == (tiny_checkpoint / "tokenizer").resolve()


def test_tokenizer_loads_offline_with_auto_tokenizer(tiny_checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoint / "tokenizer"))
    assert tokenizer("héllo")["input_ids"] == list("héllo".encode())
    assert tokenizer.decode(list("héllo".encode())) == "héllo"
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 256
    assert "user: hi" in tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


def test_second_call_is_free(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prepared checkpoint is found, not built again: no builder runs, nothing is written or left beside it."""
    before = {p: p.stat().st_mtime_ns for p in tiny_checkpoint.rglob("*")}
    beside = sorted(p.name for p in tiny_checkpoint.parent.iterdir())

    def never(name: str, out_dir: Path) -> None:
        raise AssertionError(f"{name} was built again into {out_dir}")

    monkeypatch.setattr(prepare, "_run_builder", never)
    assert prepare_checkpoint("tiny", tiny_checkpoint) == tiny_checkpoint
    assert ensure_prepared("tiny", tiny_checkpoint) == tiny_checkpoint
    assert {p: p.stat().st_mtime_ns for p in tiny_checkpoint.rglob("*")} == before
    assert sorted(p.name for p in tiny_checkpoint.parent.iterdir()) == beside  # no temporary directory, no lock


def test_another_models_checkpoint_is_not_replaced_without_force(tiny_checkpoint: Path) -> None:
    with pytest.raises(DeploymentError, match="not the current smollm2") as info:
        prepare_checkpoint("smollm2", tiny_checkpoint)
    assert info.value.hint and "--force" in info.value.hint


def test_a_directory_that_is_not_a_checkpoint_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    for force in (False, True):
        with pytest.raises(DeploymentError, match="is not a checkpoint"):
            prepare_checkpoint("tiny", tmp_path / "mine", force=force)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_unknown_model(tmp_path: Path) -> None:
    with pytest.raises(DeploymentError, match="Unknown packaged model 'gpt5'"):
        prepare_checkpoint("gpt5", tmp_path / "x")  # type: ignore[arg-type]


def test_default_location_follows_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_checkpoint_dir("smollm2") == tmp_path / "cache" / "ckpteval" / "checkpoints" / "smollm2"


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_then_fail(name: str, out_dir: Path) -> None:
        (out_dir / "iter_0000000").mkdir()
        (out_dir / "iter_0000000" / "__0_0.distcp").write_bytes(b"partial")
        raise DeploymentError("Preparing tiny failed (exit code 1): disk full")

    monkeypatch.setattr(prepare, "_run_builder", half_then_fail)
    with pytest.raises(DeploymentError, match="disk full"):
        prepare_checkpoint("tiny", tmp_path / "tiny")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tiny.lock"]


def test_concurrent_preparations_build_once(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    calls = []

    def copy_slowly(name: str, out_dir: Path) -> None:  # stands in for the 25 s build
        calls.append(name)
        time.sleep(0.5)
        for item in tiny_checkpoint.iterdir():
            if item.name != prepare.MANIFEST_FILE:
                (shutil.copytree if item.is_dir() else shutil.copy)(item, out_dir / item.name)

    monkeypatch.setattr(prepare, "_run_builder", copy_slowly)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_prepared("tiny", tmp_path / "t"))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["tiny"]
    assert results == [tmp_path / "t"] * 3
    assert prepare.is_prepared(tmp_path / "t", "tiny")


def test_force_rebuilds_in_place(tiny_checkpoint: Path, tmp_path: Path) -> None:
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint, target)
    (target / "iter_0000000" / "stale-file").write_text("x")
    assert prepare_checkpoint("tiny", target, force=True) == target
    assert not (target / "iter_0000000" / "stale-file").exists()
    assert prepare.is_prepared(target, "tiny")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".copy.")] == [".copy.lock"]
