"""The torch-free readers of common.pt and the torch_dist index give what torch itself reads, import no torch,
and build nothing but data from a file."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from ckpteval.checkpoint.torchfiles import StandIn, read_tensor_index, read_torch_save
from ckpteval.errors import DeploymentError


def test_common_pt_args_equal_what_torch_loads(tiny_checkpoint: Path) -> None:
    import torch

    common = tiny_checkpoint / "iter_0000000" / "common.pt"
    ours = read_torch_save(common)
    theirs = torch.load(common, map_location="cpu", weights_only=False)
    assert vars(ours["args"]) == vars(theirs["args"])
    assert ours["iteration"] == theirs["iteration"] and ours["checkpoint_version"] == theirs["checkpoint_version"]


def test_tensor_index_equals_torch_dcp_metadata(tiny_checkpoint: Path) -> None:
    from ckpteval.server.checkpoint import checkpoint_tensor_shapes

    iter_dir = tiny_checkpoint / "iter_0000000"
    ours = read_tensor_index(iter_dir / ".metadata")
    assert {k: shape for k, (shape, _) in ours.items()} == checkpoint_tensor_shapes(iter_dir)
    assert {dtype for _, dtype in ours.values()} == {"float32"}
    assert ours["embedding.word_embeddings.weight"][0] == (257, 64)


def test_reading_imports_no_torch(tiny_checkpoint: Path) -> None:
    iter_dir = tiny_checkpoint / "iter_0000000"
    common, index = str(iter_dir / "common.pt"), str(iter_dir / ".metadata")
    code = (
        "import sys; from pathlib import Path;"
        "from ckpteval.checkpoint.torchfiles import read_torch_save, read_tensor_index;"
        f"a = read_torch_save(Path({common!r}))['args']; read_tensor_index(Path({index!r}));"
        "print(a.num_layers, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["2", "False"]


def test_torch_objects_become_inert_stand_ins(tmp_path: Path) -> None:
    import argparse

    import torch

    path = tmp_path / "common.pt"
    args = argparse.Namespace(params_dtype=torch.bfloat16, rng=torch.zeros(3, 2), num_layers=4)
    torch.save({"args": args}, path)
    read = read_torch_save(path)["args"]
    assert read.params_dtype == "bfloat16" and read.rng.shape == (3, 2) and read.num_layers == 4


class _Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (subprocess.call, (["touch", "/tmp/ckpteval-pwned"],))


def test_a_pickle_that_would_run_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(DeploymentError, match=r"subprocess\.call object"):
        read_tensor_index(path)
    assert not Path("/tmp/ckpteval-pwned").exists()


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04 truncated"], ids=["empty", "text", "cut"])
def test_a_damaged_common_pt_is_one_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "common.pt"
    path.write_bytes(content)
    with pytest.raises(DeploymentError, match=r"common\.pt"):
        read_torch_save(path)


def test_stand_in_reads_state() -> None:
    item = StandIn(1)
    item.__setstate__({"size": (2, 3)})
    assert item.size == (2, 3) and str(item) == "1"
