"""Tokenizers: the checkpoint's Hugging Face tokenizer as the server uses it, and the byte tokenizer.

Every checkpoint carries a Hugging Face tokenizer directory, so clients (lm-eval's
`tokenizer_backend=huggingface`) and the server tokenize identically, offline. The tiny test model
uses a byte-level tokenizer in the same format: ids 0-255 are the bytes, 256 is <|endoftext|>.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpteval.checkpoint.tokenizer_convert import bytes_to_unicode
from ckpteval.errors import DeploymentError

BYTE_EOS = "<|endoftext|>"
# A plain-text template so the tiny model can be chatted with like any other checkpoint.
BYTE_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def write_byte_tokenizer(directory: Path) -> None:
    """Save a Hugging Face byte-level tokenizer (257 ids) to `directory`, loadable with AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = bytes_to_unicode()
    backend = Tokenizer(models.BPE(vocab={byte_chars[b]: b for b in range(256)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=BYTE_EOS, chat_template=BYTE_CHAT_TEMPLATE)
    tokenizer.save_pretrained(str(directory))


def _piece(decoded: str, raw: str) -> str:
    """The text shown for one token: what it decodes to, as it would read inside a text."""
    if "\ufffd" in decoded:
        # part of a UTF-8 character: its vocabulary string ("Ã", "<0xE2>") keeps distinct tokens
        # distinct keys in top_logprobs
        return raw
    if raw.startswith("\u2581") and not decoded.startswith(" "):  # SentencePiece drops a lone token's space
        return " " + decoded
    return decoded


class ServedTokenizer:
    """A checkpoint's tokenizer with what the server needs per request precomputed.

    `pieces[i]` is token i decoded on its own: the text OpenAI-style log-prob fields show for it
    (its vocabulary string when it is only part of a character).
    """

    def __init__(self, directory: Path) -> None:
        from transformers import AutoTokenizer

        try:
            self.hf: Any = AutoTokenizer.from_pretrained(str(directory))
        except (OSError, ValueError) as exc:
            raise DeploymentError(f"The tokenizer in {directory} cannot be loaded: {exc}") from None
        self.directory = directory
        self.vocab_size = len(self.hf)
        decoded = self.hf.batch_decode(
            [[i] for i in range(self.vocab_size)], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        raw = self.hf.convert_ids_to_tokens(list(range(self.vocab_size)))
        self.pieces: list[str] = [_piece(d, str(r)) for d, r in zip(decoded, raw, strict=True)]
        self._backend = getattr(self.hf, "_tokenizer", None)  # tokenizers.Tokenizer of a fast tokenizer
        self.eos_token_id: int | None = self.hf.eos_token_id
        self.stop_token_ids = frozenset(i for i in (self.eos_token_id,) if i is not None)

    @property
    def chat_template(self) -> str | None:
        return self.hf.chat_template

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (with the tokenizer's BOS etc. when `add_special_tokens`)."""
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        """Text of `ids`; ids outside the tokenizer's vocabulary are dropped."""
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            ids = [i for i in ids if 0 <= i < self.vocab_size]
        if self._backend is not None:  # the Rust tokenizer directly: what hf.decode does, minus its checks
            return str(self._backend.decode(ids, skip_special_tokens=skip_special_tokens))
        return str(self.hf.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False))

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for a conversation: the chat template with the assistant turn opened."""
        return str(self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def info(self) -> dict[str, Any]:
        """What lm-eval's and vLLM's /tokenizer_info clients read."""
        return {
            "tokenizer_class": type(self.hf).__name__,
            "eos_token": self.hf.eos_token,
            "eos_token_id": self.eos_token_id,
            "bos_token": self.hf.bos_token,
            "bos_token_id": self.hf.bos_token_id,
            "pad_token": self.hf.pad_token,
            "pad_token_id": self.hf.pad_token_id,
            "chat_template": self.chat_template,
            "vocab_size": self.vocab_size,
        }
