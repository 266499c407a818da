"""The corpus: tiny real Megatron checkpoints of what users bring, built once per test session on the CPU.

Architectures (from transformers models: Llama-3 with RoPE scaling, Qwen2 with qkv bias and tied embeddings,
Qwen3 with qk-layernorm, Mistral with a sliding window, Mixtral and Qwen3 MoE, Nemotron-4), saves with TP=2
and PP=2 of one TP=1 model, one checkpoint per tokenizer kind its args can name (the files beside it, not a
tokenizer/ directory), and the same kind of model in Megatron-Bridge's layout. Every builder is megatron-core
itself writing torch_dist (tests/support/corpus/).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.corpus import built_once
from tests.support.corpus.architectures import NAMES, build_many
from tests.support.corpus.bridge import build_bridge_llama
from tests.support.corpus.edit import with_args
from tests.support.corpus.sharded import build_sharded
from tests.support.corpus.tokenizers import KINDS, write_tokenizer_files

ARCHITECTURES = ("llama3", "qwen2", "qwen3", "mistral_window", "mixtral_moe", "qwen3_moe", "nemotron4")


def with_tokenizer(source: Path, target: Path, kind: str, files: Path) -> Path:
    """`source` (a TP=1 or TP=2 save with a 512-row vocabulary) whose args name a `kind` tokenizer whose files
    lie in `files` (as on a training cluster), with no tokenizer/ directory beside it."""
    args = write_tokenizer_files(kind, files)
    checkpoint = with_args(source, target, **args)
    shutil.rmtree(checkpoint / "tokenizer", ignore_errors=True)
    return checkpoint


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> checkpoint root."""
    base = tmp_path_factory.mktemp("corpus")
    # the same builds as the unit parity and sharding tests (one set per session, whichever module asks first)
    architectures = built_once(tmp_path_factory, "architectures", lambda root: build_many({n: root / n for n in NAMES}))
    out = {name: architectures[name] for name in ARCHITECTURES}
    sharded = built_once(tmp_path_factory, "sharded", build_sharded)
    out.update({name: sharded[name] for name in ("tp1", "tp2", "pp2", "legacy_tp1")})
    for kind in KINDS:
        out[f"tokenizer-{kind}"] = with_tokenizer(sharded["tp1"], base / f"tok-{kind}", kind, base / f"files-{kind}")
    out["tokenizer-Llama2Tokenizer-tp2"] = with_tokenizer(
        sharded["tp2"], base / "tok-llama2-tp2", "Llama2Tokenizer", base / "files-llama2-tp2"
    )
    out["bridge"] = build_bridge_llama(base / "bridge")
    return out
