"""Real tiny tokenizer files of every kind a Megatron checkpoint's args can name, trained here in seconds.

`write_tokenizer_files(kind, directory)` writes the files and returns the Megatron-LM args that name them
(set them on a checkpoint's args: tokenizer_type, tokenizer_model / vocab_file / merge_file, ...).
Each tokenizer has fewer than 512 tokens, so a tiny model with padded_vocab_size 512 fits all of them.
"""

from __future__ import annotations

import base64
import io
import json
import random
from pathlib import Path
from typing import Any

KINDS = (
    "GPT2BPETokenizer",
    "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer",
    "Llama2Tokenizer",
    "TikTokenizer",
    "HuggingFaceTokenizer",
)
TIKTOKEN_NUM_SPECIAL = 16
PADDED_VOCAB = 512

_WORD_LINE = (
    "the quick brown fox jumps over lazy dog model token evaluation checkpoint megatron server language "
    "text data question answer number score prompt value result inside outside before after"
)
_WORDS = _WORD_LINE.split()
_EXTRA_LINES = [
    "日本語のテキストです。",
    "中文文本测试,中文。",
    "数字 12345 and 67890 or 3.14",
    "tabs\tand  two spaces",
    "café naïve résumé façade",
    "def main():\n    return 0\n",
    "emoji 😀 and 🎉 here",
]


def training_lines() -> list[str]:
    """A few KB of fixed text (English words, CJK, digits, accents, code, emoji)."""
    rng = random.Random(0)
    lines = []
    for _ in range(300):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        lines.append(" ".join(words) + rng.choice([".", "!", "?", ",", ""]))
    return lines + _EXTRA_LINES * 6


def write_sentencepiece_model(path: Path, *, model_type: str = "bpe") -> Path:
    """A SentencePiece model trained on `training_lines()`: "bpe" is Llama-style (byte fallback, spaces
    kept, digits split, no normalization); "unigram" is sentencepiece's default (nmt_nfkc, extra spaces removed)."""
    import sentencepiece

    if model_type == "bpe":
        options: dict[str, Any] = {
            "model_type": "bpe",
            "vocab_size": 400,
            "byte_fallback": True,
            "remove_extra_whitespaces": False,
            "split_digits": True,
            "normalization_rule_name": "identity",
        }
    else:
        options = {"model_type": "unigram", "vocab_size": 200, "hard_vocab_limit": False}
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(training_lines()),
        model_writer=model,
        character_coverage=0.9995,
        minloglevel=2,
        num_threads=1,
        **options,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.getvalue())
    return path


def _train_byte_bpe(vocab_size: int, special_tokens: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_lines(), trainer=trainer)
    return tokenizer


def write_gpt2_files(directory: Path) -> tuple[Path, Path]:
    """GPT-2 style vocab.json + merges.txt (byte-level BPE, <|endoftext|> last, as in GPT-2's)."""
    tokenizer = _train_byte_bpe(400, [])
    model = json.loads(tokenizer.to_str())["model"]
    vocab = dict(model["vocab"])
    vocab["<|endoftext|>"] = len(vocab)
    directory.mkdir(parents=True, exist_ok=True)
    vocab_file, merge_file = directory / "gpt2-vocab.json", directory / "gpt2-merges.txt"
    vocab_file.write_text(json.dumps(vocab, ensure_ascii=False))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    merge_file.write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return vocab_file, merge_file


def write_tiktoken_vocab(path: Path, *, size: int = 400) -> Path:
    """Nemotron's TikToken vocabulary (what megatron's reload_mergeable_ranks reads): a JSON list of
    {"rank": i, "token_bytes": base64, "token_str": text}, ranks 0-255 the single bytes, then merges in order."""
    from ckpteval.checkpoint.tokenizer_convert import bytes_to_unicode

    tokenizer = _train_byte_bpe(size, [])
    model = json.loads(tokenizer.to_str())["model"]
    char_to_byte = {c: b for b, c in bytes_to_unicode().items()}
    entries = [bytes([b]) for b in range(256)]
    for merge in model["merges"]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        token = bytes(char_to_byte[c] for c in left + right)
        if token not in entries:
            entries.append(token)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            [
                {"rank": i, "token_bytes": base64.b64encode(t).decode(), "token_str": t.decode("utf-8", "replace")}
                for i, t in enumerate(entries)
            ]
        )
    )
    return path


def tiktoken_vocab_size(path: Path) -> int:
    """The args' vocab_size for a vocabulary written by `write_tiktoken_vocab` (all ranks + the specials)."""
    return len(json.loads(path.read_text())) + TIKTOKEN_NUM_SPECIAL


def write_hf_tokenizer_dir(directory: Path) -> Path:
    """A Hugging Face tokenizer directory (byte-level BPE with BOS/EOS and a chat template)."""
    from transformers import PreTrainedTokenizerFast

    backend = _train_byte_bpe(400, ["<|begin|>", "<|end|>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin|>",
        eos_token="<|end|>",
        chat_template="{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}",
    )
    tokenizer.save_pretrained(str(directory))
    return directory


def write_tokenizer_files(kind: str, directory: Path) -> dict[str, Any]:
    """Write a tiny real tokenizer of `kind` (a Megatron tokenizer_type) into `directory`; return the args naming it."""
    directory.mkdir(parents=True, exist_ok=True)
    args: dict[str, Any] = {
        "tokenizer_type": kind,
        "tokenizer_model": None,
        "vocab_file": None,
        "merge_file": None,
        "tiktoken_pattern": None,
        "tiktoken_num_special_tokens": 1000,
        "tokenizer_special_tokens": None,
    }
    if kind == "GPT2BPETokenizer":
        vocab_file, merge_file = write_gpt2_files(directory)
        args.update(vocab_file=str(vocab_file), merge_file=str(merge_file))
    elif kind in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"):
        model_type = "unigram" if kind == "SentencePieceTokenizer" else "bpe"
        args["tokenizer_model"] = str(
            write_sentencepiece_model(directory / f"{model_type}.model", model_type=model_type)
        )
    elif kind == "TikTokenizer":
        vocab = write_tiktoken_vocab(directory / "nemotron-tiktoken.json")
        args.update(
            tokenizer_model=str(vocab),
            tiktoken_pattern="v2",
            tiktoken_num_special_tokens=TIKTOKEN_NUM_SPECIAL,
            vocab_size=tiktoken_vocab_size(vocab),
        )
    elif kind == "HuggingFaceTokenizer":
        args["tokenizer_model"] = str(write_hf_tokenizer_dir(directory / "hf-tokenizer"))
    else:
        raise ValueError(f"no tiny tokenizer for {kind}")
    return args
