"""Token ids from megatron.core.tokenizers' own classes, built the way megatron's build_tokenizer builds them.

Run as `python -m tests.support.megatron_tokenizers` with {"tokenizers": {name: args}, "texts": [...]} on
stdin; prints {name: {"ids": [[...]], "text": [...], "vocab_size", "bos", "eos"}}. A subprocess, so
megatron (and its torch import) stays out of the test process and HF_HUB_CACHE can point at a
test-made cache (megatron's GPT2BPETokenizer resolves the hub's "gpt2" tokenizer for its class).
"""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from typing import Any

# What megatron-core 0.16's build_tokenizer reads, at Megatron-LM's defaults.
DEFAULT_ARGS: dict[str, Any] = {
    "tokenizer_type": None,
    "tokenizer_model": None,
    "vocab_file": None,
    "merge_file": None,
    "tokenizer_special_tokens": None,
    "tokenizer_hf_use_fast": False,
    "trust_remote_code": False,
    "tokenizer_hf_include_special_tokens": False,
    "tokenizer_sentencepiece_legacy": False,
    "tiktoken_pattern": None,
    "tiktoken_num_special_tokens": 1000,
    "vocab_size": None,
    "tokenizer_metadata": None,
}


def reference(args: dict[str, Any], texts: list[str]) -> dict[str, Any]:
    """What megatron's tokenizer for `args` makes of `texts`."""
    from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer

    tokenizer = build_tokenizer(Namespace(**{**DEFAULT_ARGS, **args}))
    ids = [list(map(int, tokenizer.tokenize(text))) for text in texts]

    def attr(name: str) -> int | None:
        try:
            value = getattr(tokenizer, name)
        except (AttributeError, NameError, IndexError, KeyError):
            return None
        return int(value) if value is not None else None

    return {
        "ids": ids,
        "text": [tokenizer.detokenize(i) for i in ids],
        "vocab_size": int(tokenizer.vocab_size),
        "bos": attr("bos"),
        "eos": attr("eos"),
    }


def main() -> None:
    request = json.load(sys.stdin)
    result = {name: reference(args, request["texts"]) for name, args in request["tokenizers"].items()}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
