"""Which tokenizer a checkpoint was trained with, and that tokenizer as one Hugging Face directory.

Megatron-LM records its tokenizer in the args (`tokenizer_type` and the files it read on the training
machine); the builtin server and lm-eval's clients (`tokenizer_backend=huggingface`) both load a Hugging
Face tokenizer directory. `tokenizer_source` says what the checkpoint names and whether it can be used
here (stdlib only: the dry run and `evaluate inspect` call it); `tokenizer_convert.materialize_tokenizer`
turns it once into
a Hugging Face directory, cached by content, whose token ids equal those of megatron.core.tokenizers'
class for the same files (tests/unit/checkpoint/test_tokenizer_source.py proves it per kind).

Where the tokenizer comes from, first found wins:
1. `deployment.tokenizer` (`--tokenizer`): a Hugging Face tokenizer directory or hub id (the checkpoint's
   own tokenizer/ directory, the megatron deployment's default, means "the checkpoint's tokenizer");
2. a Hugging Face tokenizer directory in <iter>/tokenizer or <root>/tokenizer (what `evaluate prepare`
   and Megatron-Bridge write);
3. what the args name. A file named there that does not exist here is looked for, by its name and by
   the name Megatron-LM's `save_tokenizer_assets` gives it, in <iter>, <iter>/tokenizer, <root> and
   <root>/tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.checkpoint.layout import TOKENIZER_DIR, CheckpointLayout, is_tokenizer_dir
from ckpteval.errors import DeploymentError

# Bump when a materialized directory would come out differently for the same files and options.
RECIPE_VERSION = 1

HF_TOKENIZER = "HuggingFaceTokenizer"
GPT2_BPE = "GPT2BPETokenizer"
SENTENCEPIECE = "SentencePieceTokenizer"
GPT_SENTENCEPIECE = "GPTSentencePieceTokenizer"
LLAMA2 = "Llama2Tokenizer"
TIKTOKEN = "TikTokenizer"
NULL = "NullTokenizer"
SENTENCEPIECE_KINDS = (SENTENCEPIECE, GPT_SENTENCEPIECE, LLAMA2)
BERT_KINDS = ("BertWordPieceLowerCase", "BertWordPieceCase")

# megatron.core.tokenizers' TikToken defaults (tiktoken_tokenizer.py)
TIKTOKEN_DEFAULT_VOCAB = 2**17
TIKTOKEN_DEFAULT_NUM_SPECIAL = 1000
TIKTOKEN_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>")
TIKTOKEN_PATTERNS = {
    "v1": r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    "v2": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
GPT2_EOD = "<|endoftext|>"

# The file name Megatron-LM's save_tokenizer_assets gives each file in <iter>/tokenizer.
_ASSET_NAMES = {
    (GPT2_BPE, "vocab_file"): "vocab.json",
    (GPT2_BPE, "merge_file"): "merges.txt",
    **{(kind, "tokenizer_model"): "tokenizer.model" for kind in SENTENCEPIECE_KINDS},
    (TIKTOKEN, "tokenizer_model"): "tokenizer.json",
}
_SETTING = "deployment.tokenizer"
_SETTING_HINT = "deployment.tokenizer (the server's --tokenizer)"
_SOURCE_FILE = "ckpteval_tokenizer_source.json"  # what a materialized directory was made from


@dataclass(frozen=True)
class TokenizerSource:
    """A checkpoint's tokenizer: its kind, the files it uses and what changes its tokenization.

    `kind` is Megatron's `tokenizer_type` (a Hugging Face directory found beside the checkpoint or given
    as `deployment.tokenizer` is HuggingFaceTokenizer too); `origin` says where it was found. `problem`
    (with `hint`) says why it cannot be used; `require()` raises it.
    """

    kind: str
    origin: str
    files: Mapping[str, Path] = field(default_factory=dict)
    hub_id: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    args_kind: str | None = None  # the args' tokenizer_type, also when another source wins
    problem: str | None = None
    hint: str | None = None

    @property
    def usable(self) -> bool:
        return self.problem is None

    def require(self) -> None:
        """Raise the DeploymentError that says why this tokenizer cannot be used (if it cannot)."""
        if self.problem is not None:
            raise DeploymentError(self.problem, hint=self.hint)

    def describe(self) -> str:
        """One line for inspection and the dry run."""
        what = self.hub_id or ", ".join(f"{role}={path}" for role, path in self.files.items()) or "no files"
        text = f"{self.kind} ({what}; from {self.origin})"
        return text if self.problem is None else f"{text}: {self.problem}"


# weight files a Hugging Face model directory holds beside its tokenizer: never part of the tokenizer
_WEIGHT_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt", ".onnx", ".distcp", ".nemo"
)  # fmt: skip


def tokenizer_files(directory: Path) -> list[Path]:
    """The files of a Hugging Face tokenizer directory that make up its tokenizer, sorted: every file in it
    but a model's weights and their index (`deployment.tokenizer` may name a whole model directory, whose
    model.safetensors is no part of the tokenizer; config.json stays: AutoTokenizer may read its class there)."""
    return sorted(
        p
        for p in directory.iterdir()
        if p.is_file()
        and not p.name.endswith(_WEIGHT_SUFFIXES)
        and not p.name.endswith(tuple(f"{s}.index.json" for s in _WEIGHT_SUFFIXES))
    )


def tokenizer_sha256(files: Mapping[str, Path]) -> str:
    """A hash of a tokenizer's files (a directory: its `tokenizer_files`), names and bytes, to tell two
    tokenizers apart in results."""
    digest = hashlib.sha256()
    for role, path in sorted(files.items()):
        for file in tokenizer_files(path) if path.is_dir() else [path]:
            digest.update(f"\0{role}\0{file.name}\0".encode())
            with open(file, "rb") as handle:
                for block in iter(lambda h=handle: h.read(1 << 20), b""):  # type: ignore[misc]
                    digest.update(block)
    return digest.hexdigest()


def is_hf_tokenizer_dir(path: Path) -> bool:
    """A Hugging Face tokenizer directory (not Megatron's copy of a TikToken vocabulary, also tokenizer.json)."""
    return is_tokenizer_dir(path)


def tokenizer_source(args: Any, layout: CheckpointLayout | None, override: str | Path | None = None) -> TokenizerSource:
    """The tokenizer to serve a checkpoint with: `override` > a HF directory beside it > its args.

    `args` is Megatron-LM's args namespace (or None); `layout` the checkpoint's directories (None when
    there is no checkpoint). Never raises for a bad tokenizer: the result's `problem` says what is wrong.
    """
    args_kind = getattr(args, "tokenizer_type", None) if args is not None else None
    if override is not None and str(override).strip() and not _is_default_place(override, layout):
        return _from_override(str(override).strip(), args_kind)
    if layout is not None:
        for directory in (layout.iter_dir / TOKENIZER_DIR, layout.root / TOKENIZER_DIR):
            if is_hf_tokenizer_dir(directory):
                return TokenizerSource(
                    kind=HF_TOKENIZER,
                    origin=f"the checkpoint's {directory}",
                    files={"directory": directory},
                    args_kind=args_kind,
                    options=_hf_options(args) if args_kind == HF_TOKENIZER else {},
                )
    return _from_args(args, layout)


def _is_default_place(override: str | Path, layout: CheckpointLayout | None) -> bool:
    """Whether `override` is the checkpoint's own tokenizer/ directory (the megatron deployment's default
    deployment.tokenizer): that place is searched anyway, and what the args name is used when it holds
    no Hugging Face tokenizer."""
    if layout is None:
        return False
    path = Path(override).expanduser()
    places = (layout.iter_dir / TOKENIZER_DIR, layout.root / TOKENIZER_DIR)
    return any(os.path.abspath(path) == os.path.abspath(place) for place in places)


def _from_override(value: str, args_kind: str | None) -> TokenizerSource:
    origin = f"{_SETTING}={value}"
    path = Path(value).expanduser()
    if path.exists() or value.startswith(("/", ".", "~")):
        if not is_hf_tokenizer_dir(path):
            return TokenizerSource(
                kind=HF_TOKENIZER,
                origin=origin,
                files={"directory": path},
                args_kind=args_kind,
                problem=f"{_SETTING}={value} is not a Hugging Face tokenizer directory"
                + ("" if path.exists() else " (it does not exist)")
                + ".",
                hint=f"Set {_SETTING_HINT} to a directory with tokenizer.json or tokenizer_config.json "
                "(tokenizer.save_pretrained(DIR)) or to a hub id in the local Hugging Face cache.",
            )
        return TokenizerSource(
            kind=HF_TOKENIZER, origin=origin, files={"directory": path.resolve()}, args_kind=args_kind
        )
    return _hub_source(value, origin=origin, args_kind=args_kind, options={})


def _hub_source(hub_id: str, *, origin: str, args_kind: str | None, options: Mapping[str, Any]) -> TokenizerSource:
    snapshot = cached_hub_snapshot(hub_id)
    if snapshot is not None:
        return TokenizerSource(
            kind=HF_TOKENIZER,
            origin=origin,
            files={"directory": snapshot},
            hub_id=hub_id,
            args_kind=args_kind,
            options=options,
        )
    problem = None
    if hub_offline():
        problem = (
            f"The tokenizer {hub_id!r} ({origin}) is not in the local Hugging Face cache "
            f"({hub_cache_dir()}), and HF_HUB_OFFLINE is set."
        )
    return TokenizerSource(
        kind=HF_TOKENIZER,
        origin=origin,
        hub_id=hub_id,
        args_kind=args_kind,
        options=options,
        problem=problem,
        hint=f"Download it where the hub is reachable (huggingface-cli download {hub_id}) into that cache, "
        f"or set {_SETTING_HINT} to a local tokenizer directory."
        if problem
        else None,
    )


def _from_args(args: Any, layout: CheckpointLayout | None) -> TokenizerSource:
    kind = getattr(args, "tokenizer_type", None) if args is not None else None
    origin = "the checkpoint's args"

    def refused(problem: str, hint: str | None = None) -> TokenizerSource:
        return TokenizerSource(
            kind=str(kind),
            origin=origin,
            args_kind=kind,
            problem=problem,
            hint=hint
            or f"Set {_SETTING_HINT} to the Hugging Face tokenizer (directory or hub id) the model was trained with.",
        )

    if kind is None:
        where = layout.root if layout is not None else "the checkpoint"
        return refused(
            f"{where} names no tokenizer: its args have no tokenizer_type and it has no tokenizer/ directory."
        )
    if kind == NULL:
        return refused(
            "The checkpoint was trained with NullTokenizer (tokenizer_type=NullTokenizer): its inputs were token "
            "ids, so there is no tokenizer to turn text into them and no text task can be evaluated."
        )
    if kind in BERT_KINDS:
        return refused(
            f"tokenizer_type={kind} is a BERT WordPiece tokenizer: ckpteval evaluates GPT-style (causal) models, "
            "and megatron-core builds this tokenizer from the hub's bert-large vocabulary."
        )
    if kind == HF_TOKENIZER:
        return _hf_from_args(args, layout, origin)
    if kind == GPT2_BPE:
        files, missing = _find_files(args, layout, kind, ("vocab_file", "merge_file"))
        special = _special_tokens(args)
        options = {"additional_special_tokens": special} if special else {}
        return missing or TokenizerSource(kind=kind, origin=origin, files=files, args_kind=kind, options=options)
    if kind in SENTENCEPIECE_KINDS:
        return _sentencepiece_from_args(args, layout, kind, origin, refused)
    if kind == TIKTOKEN:
        return _tiktoken_from_args(args, layout, origin, refused)
    return refused(f"tokenizer_type={kind} is not a tokenizer ckpteval knows how to rebuild.")


def _sentencepiece_from_args(args: Any, layout: CheckpointLayout | None, kind: str, origin: str, refused: Any) -> Any:
    legacy = bool(getattr(args, "tokenizer_sentencepiece_legacy", False))
    if legacy and _special_tokens(args):
        return refused(
            f"tokenizer_type={kind} with tokenizer_sentencepiece_legacy and tokenizer_special_tokens: megatron adds "
            "those tokens after the SentencePiece vocabulary with its own splitting, which ckpteval does not rebuild."
        )
    if getattr(args, "tokenizer_sentencepiece_ignore_extra_whitespaces", True) is False:
        return refused(
            f"tokenizer_type={kind} with tokenizer_sentencepiece_ignore_extra_whitespaces=False: megatron's "
            "whitespace-preserving encoding is not rebuilt by ckpteval."
        )
    files, missing = _find_files(args, layout, kind, ("tokenizer_model",))
    options: dict[str, Any] = {"add_bos": kind == LLAMA2}
    chat_template = getattr(args, "chat_template", None)
    if chat_template:
        options["chat_template"] = chat_template
    return missing or TokenizerSource(kind=kind, origin=origin, files=files, args_kind=kind, options=options)


def _tiktoken_from_args(args: Any, layout: CheckpointLayout | None, origin: str, refused: Any) -> Any:
    pattern = getattr(args, "tiktoken_pattern", None) or "v2"
    if pattern not in TIKTOKEN_PATTERNS:
        return refused(f"tiktoken_pattern={pattern!r} is not one of Megatron's patterns (v1, v2).")
    num_special = getattr(args, "tiktoken_num_special_tokens", None) or TIKTOKEN_DEFAULT_NUM_SPECIAL
    vocab_size = getattr(args, "vocab_size", None) or TIKTOKEN_DEFAULT_VOCAB
    special = list(_special_tokens(args) or TIKTOKEN_SPECIAL_TOKENS)
    if not set(TIKTOKEN_SPECIAL_TOKENS) <= set(special) or len(set(special)) != len(special):
        return refused(
            f"tokenizer_special_tokens={special} must be unique and include {list(TIKTOKEN_SPECIAL_TOKENS)} "
            "(megatron's TikTokenizer refuses it too)."
        )
    if not len(special) <= num_special < vocab_size:
        return refused(
            f"TikTokenizer needs len(tokenizer_special_tokens) <= tiktoken_num_special_tokens < vocab_size "
            f"(here {len(special)}, {num_special}, {vocab_size})."
        )
    files, missing = _find_files(args, layout, TIKTOKEN, ("tokenizer_model",))
    options = {
        "pattern": pattern,
        "num_special_tokens": num_special,
        "vocab_size": vocab_size,
        "special_tokens": special,
    }
    chat_template = getattr(args, "chat_template", None)
    if chat_template:
        options["chat_template"] = chat_template
    return missing or TokenizerSource(kind=TIKTOKEN, origin=origin, files=files, args_kind=TIKTOKEN, options=options)


def _hf_options(args: Any) -> dict[str, Any]:
    options: dict[str, Any] = {}
    special = _special_tokens(args)
    if special:
        options["additional_special_tokens"] = special
    chat_template = getattr(args, "chat_template", None)
    if chat_template:
        options["chat_template"] = chat_template
    return options


def _hf_from_args(args: Any, layout: CheckpointLayout | None, origin: str) -> TokenizerSource:
    model = getattr(args, "tokenizer_model", None)
    options = _hf_options(args)
    hint = f"Set {_SETTING_HINT} to the model's Hugging Face tokenizer directory or hub id."
    if not model:
        return TokenizerSource(
            kind=HF_TOKENIZER,
            origin=origin,
            args_kind=HF_TOKENIZER,
            problem=f"The checkpoint has no tokenizer: {_beside(layout)} is missing and its args "
            "(tokenizer_type=HuggingFaceTokenizer) name no tokenizer_model.",
            hint=f"Save the model's Hugging Face tokenizer there (tokenizer.save_pretrained('{_beside(layout)}')) "
            f"or set {_SETTING_HINT} to it.",
        )
    if getattr(args, "vocab_file", None) or getattr(args, "merge_file", None):
        return TokenizerSource(
            kind=HF_TOKENIZER,
            origin=origin,
            args_kind=HF_TOKENIZER,
            problem=f"tokenizer_type=HuggingFaceTokenizer with vocab_file/merge_file overriding {model}'s files "
            "is not rebuilt by ckpteval.",
            hint=hint,
        )
    path = Path(str(model)).expanduser()
    if is_hf_tokenizer_dir(path):
        return TokenizerSource(
            kind=HF_TOKENIZER,
            origin=origin,
            files={"directory": path.resolve()},
            args_kind=HF_TOKENIZER,
            options=options,
        )
    if str(model).startswith(("/", ".", "~")) or path.exists():
        found = next((d for d in _search_dirs(layout) if is_hf_tokenizer_dir(d / path.name)), None)
        if found is not None:
            return TokenizerSource(
                kind=HF_TOKENIZER,
                origin=origin,
                files={"directory": found / path.name},
                args_kind=HF_TOKENIZER,
                options=options,
            )
        return TokenizerSource(
            kind=HF_TOKENIZER,
            origin=origin,
            files={"directory": path},
            args_kind=HF_TOKENIZER,
            options=options,
            problem=f"The args' tokenizer_model {model} is not a Hugging Face tokenizer directory here"
            + _searched(layout, path.name)
            + ".",
            hint=f"Copy that directory beside the checkpoint ({_beside(layout)}) or set {_SETTING_HINT}=DIR.",
        )
    return _hub_source(str(model), origin="the args' tokenizer_model", args_kind=HF_TOKENIZER, options=options)


def _special_tokens(args: Any) -> list[str]:
    # renamed from tokenizer_special_tokens to special_tokens in Megatron-LM 2026 (same flag)
    for name in ("tokenizer_special_tokens", "special_tokens"):
        value = getattr(args, name, None)
        if value:
            return [str(t) for t in value]
    return []


def _search_dirs(layout: CheckpointLayout | None) -> list[Path]:
    if layout is None:
        return []
    dirs = [layout.iter_dir, layout.iter_dir / TOKENIZER_DIR, layout.root, layout.root / TOKENIZER_DIR]
    return list(dict.fromkeys(dirs))


def _beside(layout: CheckpointLayout | None) -> str:
    return str(layout.root / TOKENIZER_DIR) if layout is not None else "the checkpoint's tokenizer/ directory"


def _searched(layout: CheckpointLayout | None, name: str) -> str:
    dirs = _search_dirs(layout)
    return f", nor is {name} in {', '.join(str(d) for d in dirs)}" if dirs else ""


def _find_files(
    args: Any, layout: CheckpointLayout | None, kind: str, arg_names: tuple[str, ...]
) -> tuple[dict[str, Path], TokenizerSource | None]:
    """The files `arg_names` name, found here; else the source that says which is missing and where it was sought."""
    files: dict[str, Path] = {}
    for arg in arg_names:
        value = getattr(args, arg, None)
        if not value:
            return files, TokenizerSource(
                kind=kind,
                origin="the checkpoint's args",
                args_kind=kind,
                problem=f"tokenizer_type={kind} needs {arg}, but the args' {arg} is empty.",
                hint=f"Set {_SETTING_HINT} to the model's Hugging Face tokenizer (directory or hub id).",
            )
        named = Path(str(value)).expanduser()
        names = list(dict.fromkeys([named.name, _ASSET_NAMES.get((kind, arg), named.name)]))
        candidates = [named] + [d / name for d in _search_dirs(layout) for name in names]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            searched = ", ".join(str(d) for d in _search_dirs(layout)) or "nowhere else (no checkpoint)"
            return files, TokenizerSource(
                kind=kind,
                origin="the checkpoint's args",
                args_kind=kind,
                problem=f"The args' {arg} {value} (tokenizer_type={kind}) does not exist here, and no "
                f"{' or '.join(names)} is in {searched}.",
                hint=f"Copy {named.name} beside the checkpoint ({_beside(layout)}/{named.name}) "
                f"or set {_SETTING_HINT} to the model's Hugging Face tokenizer (directory or hub id).",
            )
        files[arg] = found.resolve()
    return files, None


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) forbids downloading."""
    return any(
        os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, resolved as huggingface_hub does (HF_HUB_CACHE > HF_HOME/hub > XDG)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def cached_hub_snapshot(hub_id: str, revision: str = "main") -> Path | None:
    """The cached snapshot directory of a hub model that holds a tokenizer, or None (reads no network)."""
    repo = hub_cache_dir() / ("models--" + hub_id.replace("/", "--"))
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = repo / "snapshots" / commit
    return snapshot if is_hf_tokenizer_dir(snapshot) else None


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where materialized tokenizers are kept: `cache_dir`, else $XDG_CACHE_HOME/ckpteval/tokenizers."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "ckpteval" / "tokenizers"


def source_fingerprint(source: TokenizerSource) -> str:
    """A hash of everything that decides the materialized tokenizer: the files' bytes, options, recipe."""
    digest = hashlib.sha256()
    header = {"recipe": RECIPE_VERSION, "kind": source.kind, "hub_id": source.hub_id, "options": dict(source.options)}
    digest.update(json.dumps(header, sort_keys=True, default=str).encode())
    for role, path in sorted(source.files.items()):
        paths = tokenizer_files(path) if path.is_dir() else [path]
        for file in paths:
            digest.update(f"\0{role}\0{file.relative_to(path) if path.is_dir() else ''}\0".encode())
            with open(file, "rb") as handle:
                for block in iter(lambda h=handle: h.read(1 << 20), b""):  # type: ignore[misc]
                    digest.update(block)
    return digest.hexdigest()[:32]


def tokenizer_vocab_size(directory: Path) -> int:
    """The number of ids a Hugging Face tokenizer directory can produce (its largest id + 1)."""
    tokenizer_json = directory / "tokenizer.json"
    if tokenizer_json.is_file() and is_hf_tokenizer_dir(directory):
        data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
        vocab = data.get("model", {}).get("vocab", {})
        ids = list(vocab.values()) if isinstance(vocab, dict) else [len(vocab) - 1]
        ids += [int(token["id"]) for token in data.get("added_tokens", [])]
        if ids:
            return max(ids) + 1
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(str(directory)))


def check_vocab_fits(directory: Path, padded_vocab_size: int, *, where: str = "the model") -> int:
    """Raise DeploymentError when the tokenizer can produce ids past the model's (padded) vocabulary.

    Returns the tokenizer's vocabulary size.
    """
    size = tokenizer_vocab_size(directory)
    if size > padded_vocab_size:
        raise DeploymentError(
            f"The tokenizer in {directory} has {size} tokens, more than the {padded_vocab_size} rows of "
            f"{where}'s embedding: ids past {padded_vocab_size - 1} have no embedding.",
            hint=f"This is not the tokenizer the model was trained with: set {_SETTING} to the right one.",
        )
    return size


__all__ = [
    "TokenizerSource",
    "check_vocab_fits",
    "is_hf_tokenizer_dir",
    "is_tokenizer_dir",
    "tokenizer_files",
    "tokenizer_sha256",
    "tokenizer_source",
    "tokenizer_vocab_size",
]
