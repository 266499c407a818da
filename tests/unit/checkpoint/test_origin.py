"""The checkpoint compared with the Hugging Face model it came from, before anything runs: a converted checkpoint
whose args say rotary_base=10000 next to a config.json saying rope_theta=100000 (what Megatron-LM's converter
writes for SmolLM2) is refused with both values named; with the override it runs past the check; and only the
tokenizer's files of an HF model directory are published for the task clients."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.checkpoint.description import describe_checkpoint
from ckpteval.checkpoint.origin import compare_with_origin
from ckpteval.cli.main import app
from tests.support.corpus.edit import with_args

runner = CliRunner()


def _hf_config(architecture: dict, **changes: object) -> dict:
    """config.json of the Llama model the architecture is (as Hugging Face names it), with `changes`."""
    a = architecture
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": a["num_layers"],
        "hidden_size": a["hidden_size"],
        "intermediate_size": a["ffn_hidden_size"],
        "num_attention_heads": a["num_attention_heads"],
        "num_key_value_heads": a["num_query_groups"],
        "head_dim": a["kv_channels"],
        "vocab_size": a["padded_vocab_size"],
        "rope_theta": a["rotary_base"],
        "rope_scaling": None,
        "rms_norm_eps": a["norm_epsilon"],
        "tie_word_embeddings": not a["untie_embeddings_and_output_weights"],
        "max_position_embeddings": a["max_position_embeddings"],
    }
    config.update(changes)
    return config


@pytest.fixture(scope="module")
def converted(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A checkpoint as Megatron-LM's converter leaves it (rotary_base=10000), one with the right base, and the
    Hugging Face model directory both came from (its tokenizer, config.json with rope_theta=100000, and a
    514 MiB model.safetensors: sparse, it costs no disk)."""
    base = tmp_path_factory.mktemp("origin")
    wrong = with_args(tiny_checkpoint, base / "converted", rotary_base=10000)
    right = with_args(tiny_checkpoint, base / "fixed", rotary_base=100000)
    hf = base / "hf-model"
    shutil.copytree(tiny_checkpoint / "tokenizer", hf)
    architecture = describe_checkpoint(wrong).architecture
    (hf / "config.json").write_text(json.dumps(_hf_config(architecture, rope_theta=100000.0)))
    with open(hf / "model.safetensors", "wb") as weights:
        weights.truncate(514 << 20)
    return {"wrong": wrong, "right": right, "hf": hf}


def _dry_run(checkpoint: Path, *overrides: str) -> str:
    result = runner.invoke(
        app,
        ["-c", "tiny", "-t", "gsm8k", "deployment.prepare=null", f"run.model={checkpoint}", *overrides, "--dry-run"],
    )
    return f"{result.exit_code}\n" + " ".join(result.output.split())


def test_a_rope_base_the_origin_does_not_have_is_refused_before_the_job(
    converted: dict[str, Path], isolated_user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpteval.invocation.record import list_records

    monkeypatch.setenv("COLUMNS", "300")
    out = _dry_run(converted["wrong"], f"deployment.tokenizer={converted['hf']}")
    assert out.startswith("1\n") and "Traceback" not in out, out
    assert "rotary_base=10000 in the checkpoint, rope_theta=100000 in it" in out
    assert f"deployment.tokenizer={converted['hf']}" in out and "deployment.ignore_origin_mismatch=true" in out
    # the real run is refused the same way, before anything is recorded or written
    result = runner.invoke(
        app,
        ["-c", "tiny", "-t", "gsm8k", "deployment.prepare=null", f"run.model={converted['wrong']}",
         f"deployment.origin={converted['hf']}"],
    )  # fmt: skip
    assert result.exit_code == 1 and "rope_theta=100000" in result.output
    assert list_records() == [] and not (isolated_user / "results").exists()

    # the override runs past the check, and the preview says what it let through
    out = _dry_run(
        converted["wrong"], f"deployment.tokenizer={converted['hf']}", "deployment.ignore_origin_mismatch=true"
    )
    assert out.startswith("0\n"), out
    assert "DISAGREES" in out and "rotary_base=10000 in the checkpoint, rope_theta=100000 in it" in out
    # the checkpoint with the right base agrees with its origin on every number compared
    out = _dry_run(converted["right"], f"deployment.origin={converted['hf']}")
    assert out.startswith("0\n"), out
    assert "agrees on num_layers, hidden_size" in out and "rotary_base" in out


def test_an_origin_that_names_no_model_is_one_message(converted: dict[str, Path], isolated_user: Path) -> None:
    out = _dry_run(converted["right"], f"deployment.origin={isolated_user / 'nowhere'}")
    assert out.startswith("1\n") and "Traceback" not in out
    assert "deployment.origin=" in out and "has no config.json" in out


def test_inspect_shows_the_rope_base_when_it_is_megatron_s_default(converted: dict[str, Path]) -> None:
    shown = runner.invoke(app, ["inspect", str(converted["wrong"]), "--origin", str(converted["hf"])])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "rotary_base=10000.0" in text and "norm_epsilon=" in text and "tied_embeddings=" in text
    assert "DISAGREES" in text and "rope_theta=100000" in text


def test_the_comparison_names_every_number_that_differs() -> None:
    mine = {
        "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
        "num_query_groups": 2, "kv_channels": 16, "padded_vocab_size": 49152, "position_embedding_type": "rope",
        "rotary_base": 10000.0, "rotary_percent": 1.0, "use_rope_scaling": False, "rope_scaling_factor": 8.0,
        "rotary_seq_len_interpolation_factor": None, "normalization": "RMSNorm", "norm_epsilon": 1e-5,
        "untie_embeddings_and_output_weights": False, "add_qkv_bias": False, "num_experts": None,
    }  # fmt: skip
    same = {
        "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 49152, "rope_theta": 10000, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    }  # fmt: skip
    compared, differ = compare_with_origin(mine, same)
    assert differ == [] and {"rotary_base", "rope_scaling", "padded_vocab_size", "tied_embeddings"} <= set(compared)
    # Megatron-LM pads the vocabulary: 49152 rows serve a 49131-token model, not a 50000-token one
    assert compare_with_origin(mine, {**same, "vocab_size": 49131})[1] == []
    other = {
        **same, "vocab_size": 50000, "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0},
    }  # fmt: skip
    named = {d.setting: (d.checkpoint, d.origin) for d in compare_with_origin(mine, other)[1]}
    assert named == {
        "padded_vocab_size": (49152, 50000),
        "num_query_groups": (2, 4),
        "norm_epsilon": (1e-5, 1e-6),
        "tied_embeddings": (True, False),
        "rope_scaling": ("none", "llama3 x32"),
    }


def test_only_the_tokenizer_files_of_a_model_directory_are_published(
    converted: dict[str, Path], tmp_path: Path
) -> None:
    from ckpteval.server.checkpoint import publish_tokenizer

    published = publish_tokenizer(converted["right"], tmp_path / "tokenizer", tokenizer=str(converted["hf"]))
    names = {p.name for p in published.iterdir()}
    assert "model.safetensors" not in names
    assert names == {p.name for p in converted["hf"].iterdir()} - {"model.safetensors"}
    assert sum(p.stat().st_size for p in published.iterdir()) < 10 << 20
