"""Megatron's tokenizer files as Hugging Face tokenizers (`tokenizers` pipelines), for materialize_tokenizer.

Each conversion reproduces the token ids of megatron.core.tokenizers' class for the same files
(tests/unit/checkpoint/test_tokenizer_source.py): GPT-2 BPE (vocab.json + merges.txt), SentencePiece
(.model: read with a small protobuf reader, BPE and Unigram), Nemotron's TikToken JSON vocabulary.
Imports `tokenizers` and `transformers` where it converts; `materialize_tokenizer` is the entry point.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import base64
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.checkpoint.tokenizer_source import (
    _SETTING_HINT,
    _SOURCE_FILE,
    GPT2_BPE,
    GPT2_EOD,
    HF_TOKENIZER,
    RECIPE_VERSION,
    SENTENCEPIECE_KINDS,
    TIKTOKEN,
    TIKTOKEN_PATTERNS,
    TokenizerSource,
    cache_root,
    is_hf_tokenizer_dir,
    source_fingerprint,
)
from ckpteval.errors import DeploymentError


def write_hf_tokenizer(source: TokenizerSource, out: Path) -> None:
    """Write `source` as a Hugging Face tokenizer directory into `out` (tokenizer.json + tokenizer_config.json)."""
    if source.kind == GPT2_BPE:
        tokenizer = _gpt2_tokenizer(source.files["vocab_file"], source.files["merge_file"])
    elif source.kind in SENTENCEPIECE_KINDS:
        tokenizer = _sentencepiece_tokenizer(
            source.files["tokenizer_model"], add_bos=bool(source.options.get("add_bos"))
        )
    elif source.kind == TIKTOKEN:
        tokenizer = _tiktoken_tokenizer(source.files["tokenizer_model"], source.options)
    elif source.kind == HF_TOKENIZER:
        tokenizer = _hf_tokenizer(source.files["directory"])
    else:
        raise DeploymentError(f"ckpteval cannot build a {source.kind} tokenizer.")
    special = source.options.get("additional_special_tokens")
    if special:  # what megatron's HuggingFaceTokenizer does with tokenizer_special_tokens
        tokenizer.add_special_tokens({"additional_special_tokens": list(special)})
    if source.options.get("chat_template"):
        tokenizer.chat_template = source.options["chat_template"]
    tokenizer.save_pretrained(str(out))
    config_file = out / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    if source.kind != HF_TOKENIZER:
        # transformers 5 writes "TokenizersBackend", which lm-eval clients on transformers 4 cannot load
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _hf_tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory))
    except (OSError, ValueError) as exc:
        raise DeploymentError(f"The tokenizer in {directory} cannot be loaded: {exc}") from None


def _fast(backend: Any, **special: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=backend, **{k: v for k, v in special.items() if v is not None})


def _gpt2_tokenizer(vocab_file: Path, merge_file: Path) -> Any:
    """GPT-2's byte-level BPE from vocab.json + merges.txt, as transformers' GPT2Tokenizer builds it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    try:
        vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
        lines = merge_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DeploymentError(f"The GPT-2 vocabulary {vocab_file} / {merge_file} cannot be read: {exc}") from None
    pairs = (line.split(" ") for line in lines if line and not line.startswith("#version"))
    merges = [(pair[0], pair[1]) for pair in pairs]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    eod = GPT2_EOD if GPT2_EOD in vocab else None
    if eod is not None:
        backend.add_special_tokens([AddedToken(eod, special=True, normalized=False)])
    return _fast(backend, bos_token=eod, eos_token=eod, unk_token=eod)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, which byte-level BPE vocabularies use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _tiktoken_tokenizer(path: Path, options: Mapping[str, Any]) -> Any:
    """Nemotron's TikToken vocabulary as a byte-level BPE: ranks shifted by the special tokens before them."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    num_special = int(options["num_special_tokens"])
    vocab_size = int(options["vocab_size"])
    special = list(options["special_tokens"])
    special += [f"<SPECIAL_{i}>" for i in range(len(special), num_special)]
    ranks = _read_tiktoken_ranks(path, vocab_size - num_special)
    byte_chars = bytes_to_unicode()

    def chars(token: bytes) -> str:
        return "".join(byte_chars[b] for b in token)

    vocab = {token: i for i, token in enumerate(special)}
    for token, rank in ranks.items():
        key = chars(token)
        if key in vocab:  # a special token's string: text never reaches BPE with it (specials split first)
            key = f"\u27e8ckpteval-shadowed-{rank}\u27e9"  # outside the byte alphabet: never produced
        vocab[key] = rank + num_special
    merges = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        pairs = [
            (ranks[token[:i]], ranks[token[i:]], chars(token[:i]), chars(token[i:]))
            for i in range(1, len(token))
            if token[:i] in ranks and token[i:] in ranks
        ]
        merges += [(rank, left_rank, right_rank, left, right) for left_rank, right_rank, left, right in pairs]
    merges.sort()
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges], ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(TIKTOKEN_PATTERNS[str(options["pattern"])]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return _fast(backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def _read_tiktoken_ranks(path: Path, inner_vocab: int) -> dict[bytes, int]:
    """megatron's reload_mergeable_ranks: a JSON list of {rank, token_bytes (base64), token_str}."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DeploymentError(f"The TikToken vocabulary {path} cannot be read: {exc}") from None
    if not isinstance(entries, list):
        raise DeploymentError(f"{path} is not a TikToken vocabulary (Nemotron's format is a JSON list of ranks).")
    if len(entries) < inner_vocab:
        raise DeploymentError(
            f"{path} has {len(entries)} tokens, fewer than vocab_size - tiktoken_num_special_tokens = {inner_vocab}.",
            hint="The args' vocab_size does not fit this vocabulary file; megatron would refuse it too.",
        )
    ranks: dict[bytes, int] = {}
    for i, entry in enumerate(entries[:inner_vocab]):
        if not isinstance(entry, dict) or entry.get("rank") != i or "token_bytes" not in entry:
            raise DeploymentError(f"{path}: entry {i} is not {{rank: {i}, token_bytes, token_str}}.")
        ranks[base64.b64decode(entry["token_bytes"])] = i
    if len(ranks) != inner_vocab or any(ranks.get(bytes([b])) != b for b in range(min(256, inner_vocab))):
        raise DeploymentError(f"{path}: the first 256 ranks must be the single bytes and no token may repeat.")
    return ranks


# SentencePiece piece types (sentencepiece_model.proto)
_SP_NORMAL, _SP_UNKNOWN, _SP_CONTROL, _SP_USER_DEFINED, _SP_UNUSED, _SP_BYTE = 1, 2, 3, 4, 5, 6


@dataclass
class _SentencePieceModel:
    pieces: list[tuple[str, float, int]]  # (piece, score, type)
    model_type: int = 1  # 1 unigram, 2 bpe
    byte_fallback: bool = False
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1
    treat_whitespace_as_suffix: bool = False
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True


def _read_sentencepiece(path: Path) -> _SentencePieceModel:
    """The fields of a SentencePiece ModelProto the conversion needs (a small protobuf reader: no protobuf dep)."""
    try:
        data = path.read_bytes()
        model = _SentencePieceModel(pieces=[])
        for number, value in _proto_fields(data):
            if number == 1:
                piece, score, kind = "", 0.0, _SP_NORMAL
                for n, v in _proto_fields(value):
                    if n == 1:
                        piece = v.decode("utf-8")
                    elif n == 2:
                        score = v
                    elif n == 3:
                        kind = v
                model.pieces.append((piece, score, kind))
            elif number == 2:  # TrainerSpec
                for n, v in _proto_fields(value):
                    if n == 3:
                        model.model_type = v
                    elif n == 24:
                        model.treat_whitespace_as_suffix = bool(v)
                    elif n == 35:
                        model.byte_fallback = bool(v)
                    elif n in (40, 41, 42, 43):
                        v = v - (1 << 64) if v >= 1 << 63 else v  # int32 -1 is varint-encoded as 2**64-1
                        setattr(model, {40: "unk_id", 41: "bos_id", 42: "eos_id", 43: "pad_id"}[n], v)
            elif number == 3:  # NormalizerSpec
                for n, v in _proto_fields(value):
                    if n == 2:
                        model.precompiled_charsmap = v
                    elif n == 3:
                        model.add_dummy_prefix = bool(v)
                    elif n == 4:
                        model.remove_extra_whitespaces = bool(v)
                    elif n == 5:
                        model.escape_whitespaces = bool(v)
    except (OSError, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise DeploymentError(f"{path} is not a SentencePiece model: {exc}") from None
    if not model.pieces:
        raise DeploymentError(f"{path} is not a SentencePiece model: it has no pieces.")
    return model


def _proto_fields(data: bytes) -> Iterator[tuple[int, Any]]:
    """(field number, value) of a protobuf message: varints as int, 32-bit as float, length-delimited as bytes."""

    def varint(i: int) -> tuple[int, int]:
        shift = result = 0
        while True:
            byte = data[i]
            result |= (byte & 0x7F) << shift
            i += 1
            if not byte & 0x80:
                return result, i
            shift += 7

    i = 0
    while i < len(data):
        key, i = varint(i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(i)
            yield number, value
        elif wire == 1:
            i += 8
        elif wire == 2:
            length, i = varint(i)
            yield number, data[i : i + length]
            i += length
        elif wire == 5:
            yield number, struct.unpack("<f", data[i : i + 4])[0]
            i += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _sentencepiece_tokenizer(path: Path, *, add_bos: bool) -> Any:
    """A SentencePiece model as a `tokenizers` pipeline that reproduces sentencepiece's encode_as_ids.

    As in megatron's SentencePieceTokenizer, "<s>" in a text is text (split_special_tokens): BPE merges
    are made from normal pieces only, so control pieces are never produced from text.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors

    sp = _read_sentencepiece(path)
    if sp.treat_whitespace_as_suffix or not sp.escape_whitespaces:
        raise DeploymentError(
            f"{path}: SentencePiece models with treat_whitespace_as_suffix or without escape_whitespaces "
            "are not converted by ckpteval.",
            hint=f"Set {_SETTING_HINT} to a Hugging Face tokenizer made for this model.",
        )
    if sp.model_type == 1:
        # Known gap: a text holding a control piece's string ("</s>") may match that piece here.
        vocab = [(piece, score) for piece, score, _ in sp.pieces]
        model: models.Model = models.Unigram(vocab, unk_id=sp.unk_id, byte_fallback=sp.byte_fallback)
    elif sp.model_type == 2:
        ids = {piece: i for i, (piece, _, _) in enumerate(sp.pieces)}
        normal = {piece: score for piece, score, kind in sp.pieces if kind == _SP_NORMAL}
        merges = []
        for piece, score in normal.items():
            for cut in range(1, len(piece)):
                left, right = piece[:cut], piece[cut:]
                if left in normal and right in normal:
                    merges.append((-score, ids[left], ids[right], left, right))
        merges.sort()
        unk = sp.pieces[sp.unk_id][0] if 0 <= sp.unk_id < len(sp.pieces) else None
        model = models.BPE(
            vocab=ids,
            merges=[(m[3], m[4]) for m in merges],
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=sp.byte_fallback,
        )
    else:
        raise DeploymentError(
            f"{path}: SentencePiece model type {sp.model_type} (char/word) is not converted by ckpteval.",
            hint=f"Set {_SETTING_HINT} to a Hugging Face tokenizer made for this model.",
        )
    backend = Tokenizer(model)
    steps: list[normalizers.Normalizer] = (
        [normalizers.Precompiled(sp.precompiled_charsmap)] if sp.precompiled_charsmap else []
    )
    if sp.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Strip()]
    if sp.add_dummy_prefix:
        steps.append(normalizers.Prepend(" "))
    steps.append(normalizers.Replace(" ", "\u2581"))
    backend.normalizer = normalizers.Sequence(steps)
    decode = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if sp.add_dummy_prefix:
        decode.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(decode)

    def piece_at(i: int) -> str | None:
        return sp.pieces[i][0] if 0 <= i < len(sp.pieces) else None

    added = [
        AddedToken(p, special=kind != _SP_USER_DEFINED, normalized=False)
        for p, _, kind in sp.pieces
        if kind in (_SP_UNKNOWN, _SP_CONTROL, _SP_USER_DEFINED)
    ]
    backend.add_tokens(added)
    bos = piece_at(sp.bos_id)
    if add_bos and bos is not None:  # Megatron-LM's Llama2Tokenizer.tokenize starts every text with BOS
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, sp.bos_id)]
        )
    return _fast(
        backend,
        unk_token=piece_at(sp.unk_id),
        bos_token=bos,
        eos_token=piece_at(sp.eos_id),
        pad_token=piece_at(sp.pad_id),
        split_special_tokens=True,
        add_bos_token=add_bos,
    )


def materialize_tokenizer(source: TokenizerSource, cache_dir: str | Path | None = None) -> Path:
    """A Hugging Face tokenizer directory for `source` that AutoTokenizer loads offline.

    A Hugging Face directory used as is is returned as is; anything else is converted once into
    <cache>/<hash of files and options> (written to a temporary directory, then renamed, so concurrent
    callers are safe). Raises DeploymentError when the source has a problem or cannot be converted.
    """
    source.require()
    if source.kind == HF_TOKENIZER and not source.options and "directory" in source.files:
        return source.files["directory"]
    if source.kind == HF_TOKENIZER and "directory" not in source.files:
        source = _download(source)
        if not source.options:
            return source.files["directory"]
    root = cache_root(cache_dir)
    target = root / source_fingerprint(source)
    if is_hf_tokenizer_dir(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        write_hf_tokenizer(source, scratch)
        (scratch / _SOURCE_FILE).write_text(
            json.dumps(
                {
                    "recipe": RECIPE_VERSION,
                    "kind": source.kind,
                    "origin": source.origin,
                    "hub_id": source.hub_id,
                    "files": {role: str(path) for role, path in source.files.items()},
                    "options": dict(source.options),
                },
                indent=2,
                default=str,
            )
        )
        try:
            os.rename(scratch, target)
        except OSError:
            if not is_hf_tokenizer_dir(target):  # not another caller's finished copy: a real failure
                raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def _download(source: TokenizerSource) -> TokenizerSource:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    assert source.hub_id is not None
    try:
        snapshot = snapshot_download(
            source.hub_id,
            allow_patterns=[
                "tokenizer*",
                "*.model",
                "*.tiktoken",
                "vocab*",
                "merges.txt",
                "special_tokens_map.json",
                "added_tokens.json",
                "config.json",
                "chat_template*",
            ],
        )
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise DeploymentError(
            f"The tokenizer {source.hub_id!r} ({source.origin}) cannot be downloaded: {exc}",
            hint=f"Set {_SETTING_HINT} to a local tokenizer directory, or put it in the Hugging Face cache.",
        ) from None
    return TokenizerSource(
        kind=source.kind,
        origin=source.origin,
        files={"directory": Path(snapshot)},
        hub_id=source.hub_id,
        options=source.options,
        args_kind=source.args_kind,
    )
