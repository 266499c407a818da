"""`export_checkpoint`: a Megatron checkpoint written as a Hugging Face model directory.

The checkpoint is read the way the builtin server reads it (`server.checkpoint.load_checkpoint_info`: layout,
args or run_config.yaml, tokenizer; `server.model`: the GPTModel built from the args and its weights loaded
by megatron's own resharding, so TP/PP/EP saves, legacy `torch` saves and Megatron-Bridge saves all export),
then written under the family's names (`hfexport.weights`) with config.json and generation_config.json
(`checkpoint.hf_export_config`) and the tokenizer the server would serve with (its files, chat template included).

The directory is written beside the output and renamed into place, under a lock; a manifest records the
checkpoint's content identity (`checkpoint.identity.content_identity`: its files' bytes) and the dtype, so
exporting the same checkpoint again to the same place writes nothing (`HfExport.reused`).
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import json
import shutil
import tempfile
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.config.schema import ExportDtype
from ckpteval.errors import DeploymentError
from ckpteval.server.prepare import current_umask, locked, swap_into_place

MANIFEST_FILE = "ckpteval_export.json"
MANIFEST_VERSION = 1  # bump when what is written for the same checkpoint changes
DTYPES: tuple[str, ...] = typing.get_args(ExportDtype)  # deployment.export_dtype's values
SHARD_BYTES = 5 * 1024**3  # the Hugging Face hub's shard size; vLLM and transformers read any
_OWN_FILES = ("config.json", "generation_config.json")  # never taken from the tokenizer's directory


@dataclass(frozen=True)
class HfExport:
    """A Hugging Face directory exported from a Megatron checkpoint."""

    output: Path
    checkpoint: Path  # the iteration directory exported
    identity: str  # the checkpoint's content identity (its files' bytes: `checkpoint_content_id`)
    family: str  # the Hugging Face model_type
    architecture: str  # the transformers class
    dtype: str  # of the safetensors
    checkpoint_dtype: str  # of the checkpoint's stored weights
    vocab_size: int  # rows written (the tokenizer's ids)
    padded_vocab_size: int  # rows in the checkpoint
    tensors: int
    bytes: int
    tensors_written: int  # 0 when an earlier export of the same checkpoint was found
    tokenizer: str  # the directory the tokenizer files came from

    @property
    def reused(self) -> bool:
        return self.tensors_written == 0

    def provenance(self) -> dict[str, Any]:
        """What results.json keeps of it."""
        values = dataclasses.asdict(self)
        values.update(output=str(self.output), checkpoint=str(self.checkpoint), reused=self.reused)
        return values


def checkpoint_content_id(iter_dir: Path) -> str:
    """The identity of the checkpoint's content, as the builtin server reports it and results record it (a
    SHA-256 over its files' bytes, larger ones sampled above 8 GiB: `checkpoint.identity.content_identity`):
    the key of an export cache. Two saves of one training differ here, where names and sizes do not."""
    from ckpteval.checkpoint.identity import content_identity

    identity = content_identity(iter_dir)
    return f"{identity.method}:{identity.sha256}"


def stored_dtype(iter_dir: Path) -> str:
    """The dtype the checkpoint's weights are saved in (that of its word embeddings)."""
    from ckpteval.checkpoint.args import EMBEDDING_KEY
    from ckpteval.checkpoint.layout import legacy_state_file

    if legacy_state_file(iter_dir) is not None:
        from ckpteval.server.checkpoint import legacy_model_state

        tensors = legacy_model_state(iter_dir)
        dtype = tensors.get(EMBEDDING_KEY, next(iter(tensors.values()), None))
        return _dtype_name(getattr(dtype, "dtype", None))
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(iter_dir)).read_metadata().state_dict_metadata
    entry = metadata.get(EMBEDDING_KEY)
    return _dtype_name(getattr(getattr(entry, "properties", None), "dtype", None))


def _dtype_name(dtype: Any) -> str:
    import torch

    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    if dtype not in names:
        raise DeploymentError(
            f"The checkpoint's weights are stored as {dtype}; only float32, bfloat16 and float16 are."
        )
    return names[dtype]


def unpadded_vocab_size(args: Any, tokenizer_dir: Path, padded: int) -> int:
    """How many embedding rows are the tokenizer's: `vocab_size` in the args (what Megatron-LM padded from)
    when it is recorded and covers the tokenizer, else the tokenizer's own size."""
    from ckpteval.checkpoint.tokenizer_source import tokenizer_vocab_size

    ids = tokenizer_vocab_size(tokenizer_dir)
    recorded = getattr(args, "vocab_size", None)
    if isinstance(recorded, int) and ids <= recorded <= padded:
        return recorded
    return min(ids, padded)


def export_checkpoint(
    checkpoint: str | Path,
    output: str | Path,
    *,
    dtype: str = "checkpoint",
    tokenizer: str | None = None,
    force: bool = False,
) -> HfExport:
    """Write `checkpoint` (a Megatron root or iter_* directory) as a Hugging Face directory at `output`.

    `dtype`: "checkpoint" (the stored weights' dtype) or float32 / bfloat16 / float16. `tokenizer` overrides
    the checkpoint's (as `deployment.tokenizer` does for the server). An export of the same checkpoint content
    in the same dtype already at `output` is returned as it is (nothing written) unless `force`. Refuses, before
    reading a weight, an architecture no Hugging Face family computes, and a non-empty `output` that is not an
    export. Nothing half-written is ever left at `output`.
    """
    from ckpteval.checkpoint.hf_export_config import hf_family
    from ckpteval.server.checkpoint import load_checkpoint_info

    if dtype not in DTYPES:
        raise DeploymentError(f"Unknown dtype {dtype!r}.", hint=f"Use one of {', '.join(DTYPES)}.")
    info = load_checkpoint_info(checkpoint, tokenizer=tokenizer)
    family = hf_family(info.architecture, where=str(info.iter_dir))
    saved_in = stored_dtype(info.iter_dir)
    target_dtype = saved_in if dtype == "checkpoint" else dtype
    identity = checkpoint_content_id(info.iter_dir)
    output = Path(output).expanduser().absolute()
    output.parent.mkdir(parents=True, exist_ok=True)
    with locked(output.parent / f".{output.name}.lock"):
        found = None if force else _existing(output, identity, target_dtype, tokenizer_dir=info.tokenizer_dir)
        if found is not None:
            return found
        _check_replaceable(output, force=force)
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
        staging.chmod(0o777 & ~current_umask())  # an export is read by other users' jobs, as a checkpoint is
        try:
            result = _write(info, family, staging, output, identity, saved_in, target_dtype)
            swap_into_place(staging, output)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return result


def _write(info: Any, family: Any, staging: Path, output: Path, identity: str, saved_in: str, dtype: str) -> HfExport:
    from ckpteval.checkpoint.hf_export_config import generation_config, hf_config
    from ckpteval.hfexport.weights import megatron_to_hf
    from ckpteval.server.model import build_gpt_model, load_weights
    from ckpteval.server.runtime import init_runtime, quiet_library_logs, torch_dtype

    quiet_library_logs()
    arch = info.architecture
    vocab = unpadded_vocab_size(info.args, info.tokenizer_dir, arch.padded_vocab_size)
    init_runtime("cpu", saved_in, trained_in=arch.params_dtype)
    model = build_gpt_model(arch, dtype=saved_in)  # the stored dtype: loading rounds nothing
    load_weights(model, info.iter_dir)
    tensors = megatron_to_hf(model.state_dict(), arch, family, vocab_size=vocab)
    total = _write_safetensors(tensors, staging, torch_dtype(dtype))
    del model

    tokenizer_ids = _copy_tokenizer(info.tokenizer_dir, staging)
    config = hf_config(arch, family, vocab_size=vocab, dtype=dtype, **tokenizer_ids)
    _write_json(staging / "config.json", config)
    _write_json(staging / "generation_config.json", generation_config(family, **tokenizer_ids))
    result = HfExport(
        output=output,
        checkpoint=info.iter_dir,
        identity=identity,
        family=family.model_type,
        architecture=family.architecture,
        dtype=dtype,
        checkpoint_dtype=saved_in,
        vocab_size=vocab,
        padded_vocab_size=arch.padded_vocab_size,
        tensors=len(tensors),
        bytes=total,
        tensors_written=len(tensors),
        tokenizer=str(info.tokenizer_dir),
    )
    manifest = {**result.provenance(), "version": MANIFEST_VERSION}
    for key in ("output", "tensors_written", "reused"):
        manifest.pop(key)
    _write_json(staging / MANIFEST_FILE, manifest)
    return result


def _write_safetensors(tensors: dict[str, Any], directory: Path, dtype: Any) -> int:
    """model.safetensors, or model-0000i-of-0000n.safetensors + their index past SHARD_BYTES; returns the bytes."""
    from safetensors.torch import save_file

    shards: list[list[str]] = [[]]
    size = 0
    total = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * dtype.itemsize
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
        total += nbytes
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    for file_name, keys in zip(names, shards, strict=True):
        # a copy of each: slices of one fused tensor may not share storage in a safetensors file
        save_file(
            {k: tensors[k].detach().to(dtype).contiguous().clone() for k in keys},
            str(directory / file_name),
            metadata={"format": "pt"},
        )
    if len(shards) > 1:
        weight_map = {k: file_name for file_name, keys in zip(names, shards, strict=True) for k in keys}
        _write_json(
            directory / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map}
        )
    return total


def _copy_tokenizer(source: Path, directory: Path) -> dict[str, int | None]:
    """Copy the tokenizer's files (its chat template with them); its (bos, eos, pad) token ids."""
    from transformers import AutoTokenizer

    from ckpteval.checkpoint.tokenizer_source import tokenizer_files

    for item in tokenizer_files(source):
        if item.name not in _OWN_FILES:
            shutil.copy2(item, directory / item.name)
    tok = AutoTokenizer.from_pretrained(str(directory))
    return {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_manifest(output: Path) -> dict[str, Any] | None:
    """The manifest of an export at `output`, or None when there is none."""
    try:
        value = json.loads((Path(output) / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _existing(output: Path, identity: str, dtype: str, *, tokenizer_dir: Path) -> HfExport | None:
    manifest = read_manifest(output)
    if manifest is None or manifest.get("version") != MANIFEST_VERSION:
        return None
    if (manifest.get("identity"), manifest.get("dtype"), manifest.get("tokenizer")) != (
        identity,
        dtype,
        str(tokenizer_dir),
    ):
        return None
    fields = {f.name for f in dataclasses.fields(HfExport)}
    values = {k: v for k, v in manifest.items() if k in fields}
    values.update(output=output, checkpoint=Path(manifest["checkpoint"]), tensors_written=0)
    return HfExport(**values)


def _check_replaceable(output: Path, *, force: bool) -> None:
    if not output.exists():
        return
    if not output.is_dir():
        raise DeploymentError(f"{output} exists and is a file.", hint="Choose another output directory.")
    if not any(output.iterdir()):
        return
    if read_manifest(output) is None:
        raise DeploymentError(
            f"{output} already exists and is not an export of ckpteval's; not replacing it.",
            hint="Choose another output directory (or an empty one).",
        )
    if not force:
        raise DeploymentError(
            f"{output} holds an export of another checkpoint (or of this one in another dtype or with another "
            "tokenizer).",
            hint="Pass --force to replace it, or choose another output directory.",
        )
