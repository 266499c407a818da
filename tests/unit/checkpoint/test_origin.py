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
    assert "rotary_base=10000," in text and "norm_epsilon=" in text and "tied_embeddings=" in text
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
    compared, differ, not_compared = compare_with_origin(mine, same)
    assert differ == [] and {"rotary_base", "padded_vocab_size", "tied_embeddings"} <= set(compared)
    assert "rope_type (config.json does not say)" in not_compared  # no rope_scaling key: not read as none
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
        "rope_type": ("default", "llama3"),
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


def _saved_config(target: Path, architecture: dict, kind: str = "llama", **settings: object) -> Path:
    """config.json as the pinned transformers' `save_pretrained` writes it (transformers 5: `rope_parameters`,
    no top-level `rope_theta`) for the architecture, as a `kind` model with `settings`."""
    import transformers

    a = architecture
    classes = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}
    config = classes[kind](
        num_hidden_layers=a["num_layers"],
        hidden_size=a["hidden_size"],
        intermediate_size=a["ffn_hidden_size"],
        num_attention_heads=a["num_attention_heads"],
        num_key_value_heads=a["num_query_groups"],
        head_dim=a["kv_channels"],
        vocab_size=a["padded_vocab_size"],
        max_position_embeddings=a["max_position_embeddings"],
        rms_norm_eps=a["norm_epsilon"],
        tie_word_embeddings=not a["untie_embeddings_and_output_weights"],
        **settings,
    )
    config.save_pretrained(str(target))
    return target


LLAMA31_ROPE = {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}  # fmt: skip


@pytest.fixture(scope="module")
def saved_v5(converted: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """config.json files written by the pinned transformers (5) for the tiny model: with rope_theta 100000, and
    Llama-3.1's RoPE (theta 500000, llama3 scaling x8); and the tiny checkpoint converted as Llama-3.1 is."""
    base = tmp_path_factory.mktemp("origin-v5")
    architecture = describe_checkpoint(converted["right"]).architecture
    theta = {"rope_type": "default", "rope_theta": 100000.0}
    return {
        "plain": _saved_config(base / "plain", architecture, rope_parameters=theta),
        "llama31": _saved_config(base / "llama31", architecture, rope_parameters=LLAMA31_ROPE),
        "checkpoint31": with_args(
            converted["right"], base / "ckpt31", rotary_base=500000.0, use_rope_scaling=True, rope_scaling_factor=8.0
        ),
    }


def test_a_transformers_5_config_refuses_the_converter_s_rotary_base(
    converted: dict[str, Path], saved_v5: dict[str, Path]
) -> None:
    from ckpteval.checkpoint.description import refuse_origin_mismatch
    from ckpteval.errors import DeploymentError

    written = json.loads((saved_v5["plain"] / "config.json").read_text())
    assert "rope_theta" not in written and written["rope_parameters"]["rope_theta"] == 100000.0  # the v5 format
    wrong = describe_checkpoint(converted["wrong"], origin=str(saved_v5["plain"]))
    assert wrong.origin is not None
    assert [str(d) for d in wrong.origin.disagreements] == [
        "rotary_base=10000 in the checkpoint, rope_parameters.rope_theta=100000 in it"
    ]
    with pytest.raises(DeploymentError, match=r"rope_parameters\.rope_theta=100000"):
        refuse_origin_mismatch(wrong)
    right = describe_checkpoint(converted["right"], origin=str(saved_v5["plain"])).origin
    assert right is not None and right.disagreements == ()
    # every forward-pass setting of the tiny Llama is said by a Llama config.json written by transformers
    assert {"rotary_base", "rope_type", "activation", "normalization", "qk_norm", "qkv_bias", "window_size"} <= set(
        right.compared
    )
    assert right.not_compared == ()


def test_a_llama_3_1_conversion_with_a_transformers_5_config_is_accepted(saved_v5: dict[str, Path]) -> None:
    check = describe_checkpoint(saved_v5["checkpoint31"], origin=str(saved_v5["llama31"])).origin
    assert check is not None and check.disagreements == (), [str(d) for d in check.disagreements]
    assert {"rope_type", "rope_scaling.factor", "rope_scaling.high_freq_factor"} <= set(check.compared)


def test_the_scaling_s_factors_are_compared_and_an_absent_one_is_never_none(
    converted: dict[str, Path], saved_v5: dict[str, Path], tmp_path: Path
) -> None:
    architecture = describe_checkpoint(saved_v5["checkpoint31"]).architecture
    # Llama-3.2's factor 32 where the checkpoint says 8; a high_freq_factor megatron-core does not use
    config = json.loads((saved_v5["llama31"] / "config.json").read_text())
    config["rope_parameters"].update(factor=32.0, high_freq_factor=2.0)
    named = {str(d) for d in compare_with_origin(architecture, config)[1]}
    assert named == {
        "rope_scaling.factor=8 in the checkpoint (args rope_scaling_factor or rotary_seq_len_interpolation_factor), "
        "rope_parameters.factor=32 in it",
        "rope_scaling.high_freq_factor=4 in the checkpoint (args none: megatron-core fixes 4), "
        "rope_parameters.high_freq_factor=2 in it",
    }
    # a checkpoint that lost its scaling, next to a v5 config that has one: the type disagrees (not "none")
    plain = describe_checkpoint(converted["right"]).architecture
    lost = {d.setting: d.origin for d in compare_with_origin({**plain, "rotary_base": 500000.0}, config)[1]}
    assert lost == {"rope_type": "llama3"}
    # a config.json that says nothing about RoPE: listed as not compared, never as agreeing
    bare = {k: v for k, v in config.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
    compared, differ, not_compared = compare_with_origin(plain, bare)
    assert differ == [] and "rotary_base" not in compared and "rope_type" not in compared
    assert "rotary_base (config.json does not say)" in not_compared
    assert "rope_type (config.json does not say)" in not_compared


def test_what_the_model_type_fixes_is_compared(converted: dict[str, Path], tmp_path: Path) -> None:
    """Qwen2's config.json has no key for its QKV bias (transformers' Qwen2 attention always has one)."""
    architecture = describe_checkpoint(converted["right"]).architecture
    qwen2 = _saved_config(tmp_path / "qwen2", architecture, kind="qwen2", rope_parameters={"rope_theta": 10000.0})
    config = json.loads((qwen2 / "config.json").read_text())
    assert "attention_bias" not in config and "qkv_bias" not in config
    named = [str(d) for d in compare_with_origin(architecture, config)[1]]
    said = "qkv_bias=False in the checkpoint (args add_qkv_bias, add_bias_linear), True in it (model_type=qwen2)"
    assert said in named
    assert not [d for d in compare_with_origin({**architecture, "add_qkv_bias": True}, config)[1] if "qkv" in d.setting]


def test_inspect_and_provenance_list_what_is_not_compared(converted: dict[str, Path], tmp_path: Path) -> None:
    from ckpteval.config.compile import compile_config
    from ckpteval.config.compose import CompileRequest
    from ckpteval.job.files import checked_checkpoint

    architecture = describe_checkpoint(converted["right"]).architecture
    config = _hf_config(architecture, rope_theta=100000.0)
    del config["rms_norm_eps"]
    config["hidden_act"] = "mystery_act"
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "unknown"}))
    shown = runner.invoke(app, ["inspect", str(converted["right"]), "--origin", str(tmp_path)])
    text = " ".join(shown.output.split())
    assert shown.exit_code == 0, shown.output
    assert "not compared:" in text and "norm_epsilon (config.json does not say)" in text
    assert "activation (hidden_act=mystery_act is not one ckpteval knows)" in text
    description = describe_checkpoint(converted["right"], origin=str(tmp_path))
    compiled = compile_config(CompileRequest(configs=("tiny",), tasks=("gsm8k",)))
    recorded = checked_checkpoint(description, compiled)["origin"]
    assert "norm_epsilon (config.json does not say)" in recorded["not_compared"]
    assert "norm_epsilon" not in recorded["compared"]
