"""`describe_checkpoint` / `evaluate inspect`: what a user reads about a checkpoint before anything runs, and
the refusals a run gets, each one clear message before any side effect."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.checkpoint.description import describe_checkpoint, refuse_unservable
from ckpteval.checkpoint.forward_args import FORWARD_ARGS
from ckpteval.cli.main import app
from ckpteval.errors import DeploymentError
from ckpteval.server.checkpoint import checkpoint_tensor_shapes
from tests.support.corpus.edit import with_args

runner = CliRunner()


@pytest.fixture(scope="module")
def variants(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny checkpoint as megatron-core saved it, and copies whose args change what can serve it."""
    base = tmp_path_factory.mktemp("variants")
    out = {
        "hybrid": with_args(tiny_checkpoint, base / "hybrid", hybrid_override_pattern="M*"),
        "small-vocab": with_args(tiny_checkpoint, base / "small-vocab", padded_vocab_size=128),
        "null-tokenizer": with_args(tiny_checkpoint, base / "null-tokenizer", tokenizer_type="NullTokenizer"),
        "bf16-tp2": with_args(tiny_checkpoint, base / "bf16-tp2", bf16=True, tensor_model_parallel_size=2),
    }
    shutil.rmtree(out["null-tokenizer"] / "tokenizer")
    return out


def test_the_tiny_checkpoint_is_described_as_saved(tiny_checkpoint: Path) -> None:
    d = describe_checkpoint(tiny_checkpoint)
    assert (d.layout, d.format, d.iteration) == ("megatron-lm", "torch_dist", 0)
    assert d.family == "Llama-style GPT"  # swiglu + RMSNorm + RoPE
    shapes = checkpoint_tensor_shapes(tiny_checkpoint / "iter_0000000")  # torch's own reader
    expected = sum(_numel(s) for k, s in shapes.items() if "_extra_state" not in k)
    assert d.parameters == expected and d.weight_bytes == 4 * expected  # float32
    assert d.architecture["num_query_groups"] == 2 and d.architecture["swiglu"] is True
    assert d.tokenizer is not None and d.tokenizer.kind == "HuggingFaceTokenizer" and not d.tokenizer.problem
    assert {s.name for s in d.forward_settings} >= {"swiglu", "normalization", "position_embedding_type"}
    assert all(s.status == "served" for s in d.forward_settings)
    assert [v.backend for v in d.backends if v.can_serve] == [
        "builtin-cpu", "builtin-gpu", "export-deploy", "vllm", "sglang"
    ]  # fmt: skip
    for engine in ("vllm", "sglang"):  # through the job's export step
        reason = d.verdict(engine).reason
        assert "via its Hugging Face export (export-hf: yes, as LlamaForCausalLM)" in reason
        assert "checks parity before the engine starts" in reason


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def test_saved_parallelism_and_memory_follow_the_args(variants: dict[str, Path]) -> None:
    d = describe_checkpoint(variants["bf16-tp2"])
    assert str(d.saved_parallelism) == "TP=2 PP=1 EP=1" and d.trained_dtype == "bfloat16"
    cpu, gpu, export = (d.verdict(b) for b in ("builtin-cpu", "builtin-gpu", "export-deploy"))
    assert cpu.memory_per_gpu == int(d.parameters * 4 * 1.2)  # the CPU serves in float32
    assert gpu.memory_per_gpu == int(d.parameters * 2 * 1.2)  # one GPU, bf16: the whole model
    assert export.memory_per_gpu == int(d.parameters * 2 / 2 * 1.2)  # split over the saved TP=2


def test_hybrid_mamba_is_refused_by_the_builtin_and_named_for_export_deploy(variants: dict[str, Path]) -> None:
    d = describe_checkpoint(variants["hybrid"])
    assert d.family.startswith("hybrid Mamba")
    builtin = d.verdict("builtin-gpu")
    assert not builtin.can_serve and "hybrid_override_pattern='M*'" in builtin.reason
    assert "deployment.model_type=mamba" in builtin.hint
    assert d.verdict("export-deploy").settings == {"deployment.model_type": "mamba"}
    with pytest.raises(DeploymentError, match="builtin-cpu backend cannot serve") as caught:
        refuse_unservable(d, "builtin-cpu")
    assert "export-deploy" in (caught.value.hint or "")


@pytest.mark.parametrize("name", sorted(n for n, e in FORWARD_ARGS.items() if e.status == "refused"))
def test_every_refused_arg_is_refused_before_anything_runs(tiny_checkpoint: Path, tmp_path: Path, name: str) -> None:
    entry = FORWARD_ARGS[name]
    value = next(v for v in (True, 2, "x", 0.5) if not entry.is_harmless(v))
    d = describe_checkpoint(with_args(tiny_checkpoint, tmp_path / "ckpt", **{name: value}))
    assert not d.verdict("builtin-cpu").can_serve
    assert f"{name}={value!r}" in d.verdict("builtin-cpu").reason, d.verdict("builtin-cpu").reason
    assert any(s.name == name and s.status == "refused" for s in d.forward_settings) or name in d.problems[0]


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused(variants: dict[str, Path]) -> None:
    d = describe_checkpoint(variants["small-vocab"])
    assert d.tokenizer is not None and "257 tokens, more than the 128" in (d.tokenizer.problem or "")
    assert not d.verdict("builtin-cpu").can_serve and not d.verdict("export-deploy").can_serve


def test_a_null_tokenizer_is_refused_with_what_to_set(variants: dict[str, Path]) -> None:
    d = describe_checkpoint(variants["null-tokenizer"])
    assert d.tokenizer is not None and d.tokenizer.kind == "NullTokenizer"
    verdict = d.verdict("builtin-cpu")
    assert not verdict.can_serve and "NullTokenizer" in verdict.reason and "deployment.tokenizer" in verdict.hint
    # naming a tokenizer makes it servable
    fixed = describe_checkpoint(variants["null-tokenizer"], tokenizer=str(variants["hybrid"] / "tokenizer"))
    assert fixed.verdict("builtin-cpu").can_serve


def test_a_hugging_face_directory_is_for_vllm(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"})
    )
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 2000)
    d = describe_checkpoint(tmp_path)
    assert (d.layout, d.family, d.parameters) == ("huggingface", "LlamaForCausalLM", 1000)
    assert d.verdict("vllm").can_serve and d.verdict("sglang").can_serve and not d.verdict("builtin-gpu").can_serve


def test_inspect_command_text_json_and_bad_paths(variants: dict[str, Path], tmp_path: Path) -> None:
    shown = runner.invoke(app, ["inspect", str(variants["hybrid"])])
    assert shown.exit_code == 0, shown.output
    assert "hybrid Mamba" in shown.output and "builtin-cpu   no" in shown.output
    data = json.loads(runner.invoke(app, ["inspect", str(variants["bf16-tp2"]), "--json"]).output)
    assert data["saved_parallelism"] == {"tensor": 2, "pipeline": 1, "expert": 1, "virtual_pipeline": None}
    for bad, message in (
        (tmp_path / "missing", "does not exist"),
        (variants["hybrid"] / "latest_checkpointed_iteration.txt", "is a file"),
        (tmp_path, "is not a Megatron checkpoint"),
    ):
        result = runner.invoke(app, ["inspect", str(bad)])
        assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output, result.output


def test_a_run_is_refused_before_any_side_effect(variants: dict[str, Path], isolated_user: Path) -> None:
    from ckpteval.invocation.record import list_records

    result = runner.invoke(
        app,
        ["-c", "tiny", "-t", "gsm8k", "deployment.prepare=null", f"run.model={variants['hybrid']}", "--dry-run"],
    )
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "The builtin-cpu backend cannot serve" in text and "hybrid Mamba" in text
    assert "Traceback" not in result.output
    result = runner.invoke(
        app, ["-c", "tiny", "-t", "gsm8k", "deployment.prepare=null", f"run.model={variants['hybrid']}"]
    )
    assert result.exit_code == 1
    assert list_records() == [] and not (isolated_user / "results").exists()  # nothing recorded, nothing written


def test_the_dry_run_shows_the_checkpoint(
    tiny_checkpoint: Path, isolated_user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    result = runner.invoke(
        app, ["-c", "tiny", "-t", "gsm8k", "deployment.prepare=null", f"run.model={tiny_checkpoint}", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert "checkpoint, served by builtin-cpu: Llama-style GPT" in result.output
    assert "saved with TP=1 PP=1 EP=1" in result.output and "export-deploy yes" in result.output
