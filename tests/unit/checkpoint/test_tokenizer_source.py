"""Every tokenizer kind a Megatron checkpoint names, as one Hugging Face directory: the same token ids as
megatron.core.tokenizers' own class for the same files, on texts chosen to break conversions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from ckpteval.checkpoint.layout import CheckpointLayout
from ckpteval.checkpoint.tokenizer_convert import materialize_tokenizer
from ckpteval.checkpoint.tokenizer_source import (
    TokenizerSource,
    check_vocab_fits,
    is_hf_tokenizer_dir,
    tokenizer_source,
    tokenizer_vocab_size,
)
from ckpteval.errors import DeploymentError
from tests.support.corpus.tokenizers import KINDS, PADDED_VOCAB, write_tokenizer_files

REPO = Path(__file__).resolve().parents[3]
TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  two leading spaces",
    " one leading space",
    "trailing spaces   ",
    "runs    of     spaces",
    "tabs\tand\t\ttabs",
    "new\nlines\n\n\nand\r\nwindows",
    "mixed \t \n whitespace",
    "日本語のテキストです。中文文本测试",
    "emoji 😀🎉 and a family 👨‍👩‍👧",
    "café naïve résumé façade — “quotes” ½ ①",
    "digits 1234567890 and 3.14159",
    "def main():\n    return 0\n",
    "<s> bos and eos </s> and <unk>",
    "<|endoftext|> gpt2 end and <|begin|>chat<|end|>",
    "<SPECIAL_9> tiktoken filler <mask>",
    "",
    " ",
    "x",
]
SP_CONTROL = ("<s>", "</s>", "<unk>")


def _args(**values: Any) -> Namespace:
    return Namespace(**values)


def _fake_hub_snapshot(hub: Path, hub_id: str, files: dict[str, Path | str]) -> Path:
    """A Hugging Face cache entry, as huggingface_hub lays it out."""
    repo = hub / ("models--" + hub_id.replace("/", "--"))
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for name, content in files.items():
        if isinstance(content, Path):
            shutil.copy(content, snapshot / name)
        else:
            (snapshot / name).write_text(content)
    return snapshot


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("tokenizer-files")
    return {kind: write_tokenizer_files(kind, root / kind) for kind in KINDS}


@pytest.fixture(scope="module")
def megatron_ids(tokenizer_files: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """megatron.core.tokenizers' results on TEXTS, per kind (one subprocess for all kinds)."""
    hub = tmp_path_factory.mktemp("hub")
    gpt2 = tokenizer_files["GPT2BPETokenizer"]
    # megatron-core's GPT2BPETokenizer is transformers' GPT2Tokenizer of the hub's "gpt2", with vocab_file
    # replaced by the args' (its merges come from the hub): give it a "gpt2" with these files.
    _fake_hub_snapshot(
        hub,
        "gpt2",
        {
            "vocab.json": Path(gpt2["vocab_file"]),
            "merges.txt": Path(gpt2["merge_file"]),
            "config.json": json.dumps({"model_type": "gpt2"}),
            "tokenizer_config.json": json.dumps({"tokenizer_class": "GPT2Tokenizer"}),
        },
    )
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.megatron_tokenizers"],
        input=json.dumps({"tokenizers": tokenizer_files, "texts": TEXTS}),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def materialized(tokenizer_files: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache = tmp_path_factory.mktemp("tokenizer-cache")
    return {
        kind: materialize_tokenizer(tokenizer_source(_args(**a), None), cache) for kind, a in tokenizer_files.items()
    }


def _compared_texts(kind: str) -> list[int]:
    # Known gap (documented in tokenizer_source): a Unigram SentencePiece model's control pieces are
    # matched inside text by the `tokenizers` Unigram; sentencepiece never produces them from text.
    if kind == "SentencePieceTokenizer":
        return [i for i, t in enumerate(TEXTS) if not any(c in t for c in SP_CONTROL)]
    return list(range(len(TEXTS)))


@pytest.mark.parametrize("kind", KINDS)
def test_token_ids_equal_megatrons(kind: str, materialized: Any, megatron_ids: Any) -> None:
    from ckpteval.server.tokenizer import ServedTokenizer

    served = ServedTokenizer(materialized[kind])  # what the builtin server loads (AutoTokenizer, offline)
    expected = megatron_ids[kind]
    for i in _compared_texts(kind):
        assert served.encode(TEXTS[i], add_special_tokens=False) == expected["ids"][i], (kind, TEXTS[i])
    assert tokenizer_vocab_size(materialized[kind]) == expected["vocab_size"] == served.vocab_size
    if expected["eos"] is not None:
        assert served.eos_token_id == expected["eos"]


@pytest.mark.parametrize("kind", KINDS)
def test_bos_only_where_megatron_adds_it(kind: str, materialized: Any, megatron_ids: Any) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(materialized[kind]))
    expected = megatron_ids[kind]
    for i in _compared_texts(kind):
        with_specials = hf.encode(TEXTS[i])
        if kind == "Llama2Tokenizer":  # Megatron-LM's Llama2Tokenizer.tokenize(text, bos=True)
            assert with_specials == [expected["bos"], *expected["ids"][i]]
        else:
            assert with_specials == expected["ids"][i]


@pytest.mark.parametrize("kind", KINDS)
def test_decode_round_trips(kind: str, materialized: Any, megatron_ids: Any) -> None:
    from ckpteval.server.tokenizer import ServedTokenizer

    served = ServedTokenizer(materialized[kind])
    expected = megatron_ids[kind]
    for i in _compared_texts(kind):
        ids = expected["ids"][i]
        text = served.decode(ids, skip_special_tokens=False)
        if kind in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"):
            if 0 not in ids:  # sentencepiece shows <unk> as " ⁇ "
                assert text == expected["text"][i], TEXTS[i]  # sentencepiece's normalized text
        else:
            # megatron's TikToken decodes token by token (a split character becomes U+FFFD): the text is the reference
            assert text == TEXTS[i]


def test_sentencepiece_kinds_differ_only_in_bos(materialized: Any) -> None:
    from transformers import AutoTokenizer

    gpt = AutoTokenizer.from_pretrained(str(materialized["GPTSentencePieceTokenizer"]))
    llama = AutoTokenizer.from_pretrained(str(materialized["Llama2Tokenizer"]))
    assert llama.encode("hello world") == [llama.bos_token_id, *gpt.encode("hello world")]
    assert gpt.encode("<s>", add_special_tokens=False) != [gpt.bos_token_id]  # "<s>" in a text is text


def test_materialized_directory_is_reused_and_keyed_by_content(tokenizer_files: Any, tmp_path: Path) -> None:
    args = _args(**tokenizer_files["TikTokenizer"])
    first = materialize_tokenizer(tokenizer_source(args, None), tmp_path)
    assert materialize_tokenizer(tokenizer_source(args, None), tmp_path) == first
    other = _args(**{**tokenizer_files["TikTokenizer"], "tiktoken_pattern": "v1"})
    assert materialize_tokenizer(tokenizer_source(other, None), tmp_path) != first
    source = json.loads((first / "ckpteval_tokenizer_source.json").read_text())
    assert source["kind"] == "TikTokenizer" and source["options"]["pattern"] == "v2"


def test_concurrent_materialization_gives_one_directory(tokenizer_files: Any, tmp_path: Path) -> None:
    source = tokenizer_source(_args(**tokenizer_files["GPT2BPETokenizer"]), None)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(materialize_tokenizer(source, tmp_path))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and len(results) == 4
    assert [p.name for p in tmp_path.iterdir()] == [results[0].name]  # no temporary directory left behind


def _layout(tmp_path: Path) -> CheckpointLayout:
    iter_dir = tmp_path / "ckpt" / "iter_0000010"
    iter_dir.mkdir(parents=True)
    return CheckpointLayout(root=iter_dir.parent, iter_dir=iter_dir, iteration=10, tokenizer_dir=None)


def test_null_tokenizer_is_refused(tmp_path: Path) -> None:
    source = tokenizer_source(_args(tokenizer_type="NullTokenizer", vocab_size=128), _layout(tmp_path))
    assert "NullTokenizer" in (source.problem or "") and "deployment.tokenizer" in (source.hint or "")
    with pytest.raises(DeploymentError, match="NullTokenizer"):
        materialize_tokenizer(source, tmp_path / "cache")


def test_missing_file_names_the_arg_the_path_and_the_fix(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    args = _args(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model="/train/data/nemotron.model")
    source = tokenizer_source(args, layout)
    assert source.problem is not None and source.hint is not None
    assert "tokenizer_model" in source.problem and "/train/data/nemotron.model" in source.problem
    assert str(layout.root / "tokenizer") in source.hint and "deployment.tokenizer" in source.hint
    with pytest.raises(DeploymentError, match="tokenizer_model"):
        source.require()


@pytest.mark.parametrize("where", ["iter", "iter/tokenizer", "root", "root/tokenizer"])
def test_training_machine_path_found_beside_the_checkpoint(where: str, tokenizer_files: Any, tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    base = layout.iter_dir if where.startswith("iter") else layout.root
    directory = base / "tokenizer" if where.endswith("tokenizer") else base
    directory.mkdir(exist_ok=True)
    shutil.copy(tokenizer_files["Llama2Tokenizer"]["tokenizer_model"], directory / "llama.model")
    source = tokenizer_source(_args(tokenizer_type="Llama2Tokenizer", tokenizer_model="/train/llama.model"), layout)
    assert source.problem is None and source.files["tokenizer_model"] == (directory / "llama.model").resolve()


def test_megatron_lm_tokenizer_assets_are_found(tokenizer_files: Any, tmp_path: Path) -> None:
    """Megatron-LM's save_tokenizer_assets copies the files into <iter>/tokenizer under fixed names; its
    TikToken vocabulary is called tokenizer.json there and must not pass for a Hugging Face directory."""
    layout = _layout(tmp_path)
    assets = layout.iter_dir / "tokenizer"
    assets.mkdir()
    tik = tokenizer_files["TikTokenizer"]
    shutil.copy(tik["tokenizer_model"], assets / "tokenizer.json")
    assert not is_hf_tokenizer_dir(assets)
    source = tokenizer_source(_args(**{**tik, "tokenizer_model": "/lustre/nemotron/multiling.json"}), layout)
    assert source.kind == "TikTokenizer" and source.files["tokenizer_model"] == (assets / "tokenizer.json").resolve()


def test_hf_directory_beside_the_checkpoint_wins_over_args(tokenizer_files: Any, tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    shutil.copytree(tokenizer_files["HuggingFaceTokenizer"]["tokenizer_model"], layout.root / "tokenizer")
    source = tokenizer_source(_args(**tokenizer_files["Llama2Tokenizer"]), layout)
    assert source.kind == "HuggingFaceTokenizer" and source.args_kind == "Llama2Tokenizer"
    assert materialize_tokenizer(source, tmp_path / "cache") == layout.root / "tokenizer"


def test_override_wins_and_must_be_a_tokenizer(tokenizer_files: Any, tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    hf_dir = tokenizer_files["HuggingFaceTokenizer"]["tokenizer_model"]
    source = tokenizer_source(_args(tokenizer_type="NullTokenizer"), layout, override=hf_dir)
    assert source.problem is None and materialize_tokenizer(source) == Path(hf_dir).resolve()
    bad = tokenizer_source(_args(tokenizer_type="NullTokenizer"), layout, override=str(tmp_path))
    assert bad.problem is not None and "deployment.tokenizer" in bad.problem


def test_hub_id_from_the_local_cache_offline(tokenizer_files: Any, tmp_path: Path, monkeypatch: Any) -> None:
    hf_dir = Path(tokenizer_files["HuggingFaceTokenizer"]["tokenizer_model"])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = _fake_hub_snapshot(tmp_path / "hub", "acme/tiny", {p.name: p for p in hf_dir.iterdir()})
    source = tokenizer_source(_args(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="acme/tiny"), None)
    assert source.problem is None and source.hub_id == "acme/tiny"
    assert materialize_tokenizer(source) == snapshot

    missing = tokenizer_source(_args(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="acme/absent"), None)
    assert missing.problem is not None and "HF_HUB_OFFLINE" in missing.problem and "acme/absent" in missing.problem
    assert "deployment.tokenizer" in (missing.hint or "")
    with pytest.raises(DeploymentError, match="acme/absent"):
        materialize_tokenizer(missing, tmp_path / "cache")


def test_vocabulary_larger_than_the_model_is_refused(materialized: Any) -> None:
    for kind in KINDS:
        assert check_vocab_fits(materialized[kind], PADDED_VOCAB) <= PADDED_VOCAB
    with pytest.raises(DeploymentError, match="more than the 256 rows"):
        check_vocab_fits(materialized["TikTokenizer"], 256)


def test_tiktoken_vocab_size_past_the_file_is_refused(tokenizer_files: Any, tmp_path: Path) -> None:
    args = {**tokenizer_files["TikTokenizer"], "vocab_size": tokenizer_files["TikTokenizer"]["vocab_size"] + 10}
    with pytest.raises(DeploymentError, match="fewer than vocab_size"):
        materialize_tokenizer(tokenizer_source(_args(**args), None), tmp_path)


def test_source_is_cheap_to_describe() -> None:
    source = TokenizerSource(kind="GPT2BPETokenizer", origin="the checkpoint's args", problem="missing")
    assert "GPT2BPETokenizer" in source.describe() and "missing" in source.describe()
    code = (
        "import sys, ckpteval.checkpoint.tokenizer_source; "
        "print(sorted({'torch', 'transformers', 'tokenizers'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.strip() == "[]"


def test_override_naming_the_checkpoints_tokenizer_dir_means_the_checkpoints_tokenizer(
    tokenizer_files: Any, tmp_path: Path
) -> None:
    """deployment.tokenizer defaults to <checkpoint>/tokenizer: for a Megatron-LM checkpoint without a Hugging
    Face directory there, the args' tokenizer is used (found in Megatron's asset copy in <iter>/tokenizer)."""
    layout = _layout(tmp_path)
    (layout.iter_dir / "tokenizer").mkdir()
    shutil.copy(
        tokenizer_files["Llama2Tokenizer"]["tokenizer_model"], layout.iter_dir / "tokenizer" / "tokenizer.model"
    )
    args = _args(tokenizer_type="Llama2Tokenizer", tokenizer_model="/train/llama.model")
    for default in (layout.root / "tokenizer", layout.iter_dir / "tokenizer"):
        source = tokenizer_source(args, layout, override=str(default))
        assert source.kind == "Llama2Tokenizer" and source.problem is None


def test_serve_command_passes_the_tokenizer() -> None:
    from ckpteval.server.launch import serve_command

    argv = serve_command(python="python3", checkpoint="/c", port=1, served_model_name="m", tokenizer="acme/tiny")
    assert argv[argv.index("--tokenizer") + 1] == "acme/tiny"
    assert "--tokenizer" not in serve_command(python="python3", checkpoint="/c", port=1, served_model_name="m")
