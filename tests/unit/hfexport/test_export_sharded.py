"""Checkpoints megatron-core saved with TP=2 x PP=2 and EP=2 export the tensors of their TP=1 save (read through
the server's resharding load), with the vocabulary cut back from Megatron's TP padding (512 rows) to the
tokenizer's 257, and pass the parity check. The saves are the ones tests/unit/server/test_sharded.py builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.corpus import built_once
from tests.support.corpus.sharded import build_sharded


@pytest.fixture(scope="module")
def sharded_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return built_once(tmp_path_factory, "sharded", build_sharded)


@pytest.mark.parametrize(("sharded", "whole"), [("tp2pp2", "tp1"), ("moe_ep2", "moe_tp1")])
def test_a_sharded_save_exports_its_tp1_tensors(sharded_checkpoints, sharded: str, whole: str, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from ckpteval.hfexport.write import export_checkpoint

    exports = {name: export_checkpoint(sharded_checkpoints[name], tmp_path / name) for name in (sharded, whole)}
    ours, reference = (load_file(str(exports[n].output / "model.safetensors")) for n in (sharded, whole))
    assert sorted(ours) == sorted(reference) and all(torch.equal(ours[k], reference[k]) for k in ours)
    assert (exports[sharded].vocab_size, exports[sharded].padded_vocab_size) == (257, 512)
    assert ours["model.embed_tokens.weight"].shape[0] == 257


def test_an_ep2_moe_save_passes_the_parity_check(sharded_checkpoints, tmp_path: Path) -> None:
    from ckpteval.hfexport.parity import TOLERANCE, check_parity
    from ckpteval.hfexport.write import export_checkpoint

    export = export_checkpoint(sharded_checkpoints["moe_ep2"], tmp_path / "moe")
    assert export.architecture == "MixtralForCausalLM"
    report = check_parity(sharded_checkpoints["moe_ep2"], export.output)
    assert report.differences == [] and report.max_abs_logit_diff <= TOLERANCE
