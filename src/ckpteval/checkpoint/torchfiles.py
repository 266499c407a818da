"""Read a checkpoint's small torch files without importing torch: `common.pt`'s args, the torch_dist index.

Describing a checkpoint must be quick (it runs in every `--dry-run`) and safe (a checkpoint is someone
else's file). Importing torch takes seconds to half a minute on a busy machine, and `torch.load` of an
untrusted pickle can run code. These readers unpickle with a restricted unpickler instead: plain Python
types and the few standard classes Megatron-LM stores (argparse.Namespace, paths, ordered dicts) are rebuilt
for real; anything from torch, numpy or megatron becomes an inert `StandIn` that only records what it was
built from (a dtype reads as its name, a `torch.Size` as a tuple, a tensor as its shape); any other class is
refused. Nothing from the file is ever called.

- `common.pt` is a `torch.save` zip: `<name>/data.pkl` plus one entry per tensor storage (never read here).
- `.metadata` (torch.distributed.checkpoint) is a plain pickle of a `Metadata` dataclass.
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.errors import DeploymentError

# module -> names rebuilt as the real thing (all plain data holders; none runs code from its arguments)
_REAL = {
    "argparse": {"Namespace"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict", "defaultdict"},
    "builtins": {"set", "frozenset", "slice", "complex", "tuple", "list", "dict", "bytearray", "range"},
    "copyreg": {"_reconstructor"},
    "datetime": {"datetime", "date", "timedelta"},
}
# top-level packages whose objects become stand-ins (never imported)
_INERT = ("torch", "megatron", "numpy", "enum", "transformer_engine", "apex", "signal", "functools", "types", "io")
_DTYPES = {
    "float32",
    "float",
    "float64",
    "double",
    "float16",
    "half",
    "bfloat16",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
    "bool",
    "float8_e4m3fn",
    "float8_e5m2",
}


class StandIn:
    """An object of a class this reader does not build: what it was (`qualname`) and what it was built from."""

    qualname = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __getattr__(self, name: str) -> Any:
        state = self.__dict__.get("state")
        if isinstance(state, dict) and name in state:
            return state[name]
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict) and name in state[1]:
            return state[1][name]  # (dict, slots) from __reduce_ex__ of a slotted dataclass
        raise AttributeError(name)

    def __repr__(self) -> str:
        if self.args and len(self.args) == 1 and isinstance(self.args[0], (str, int, float)):
            return f"{self.qualname}({self.args[0]!r})"
        return f"<{self.qualname}>"

    def __str__(self) -> str:
        # an enum member's value (megatron stores a few enums in its args) reads as itself
        if self.args and len(self.args) == 1 and isinstance(self.args[0], (str, int, float)):
            return str(self.args[0])
        return repr(self)


@dataclass(frozen=True)
class TensorStandIn:
    """A tensor in a torch.save file: its shape, and its values when it is small (a step counter)."""

    shape: tuple[int, ...]
    values: tuple[Any, ...] | None = None
    dtype: str | None = None

    def item(self) -> Any:
        """The value of a one-element tensor (like torch's `Tensor.item`)."""
        if self.values is None or len(self.values) != 1:
            raise ValueError(f"a tensor of shape {self.shape} has no single value here")
        return self.values[0]


# storage class -> (dtype name, struct format); a tensor this small has its values read
_STORAGES = {
    "LongStorage": ("int64", "q"),
    "IntStorage": ("int32", "i"),
    "ShortStorage": ("int16", "h"),
    "CharStorage": ("int8", "b"),
    "ByteStorage": ("uint8", "B"),
    "BoolStorage": ("bool", "?"),
    "FloatStorage": ("float32", "f"),
    "DoubleStorage": ("float64", "d"),
    "HalfStorage": ("float16", "e"),
    "BFloat16Storage": ("bfloat16", ""),  # no struct code: shape and dtype only
}
SMALL_TENSOR = 64


@dataclass(frozen=True)
class _Storage:
    kind: str  # the storage class's name
    key: str


def _stand_in_class(module: str, name: str) -> type[StandIn]:
    return type(name, (StandIn,), {"qualname": f"{module}.{name}", "__module__": "ckpteval.checkpoint.torchfiles"})


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: io.BytesIO, where: str, read_storage: Any = None) -> None:
        super().__init__(data)
        self.where = where
        self.read_storage = read_storage  # key -> bytes, for the small tensors of a torch.save zip

    def _rebuild_tensor(self, storage: Any, offset: int, size: Any, *rest: Any) -> TensorStandIn:
        shape = tuple(size)
        count = _numel(shape)
        known = _STORAGES.get(storage.kind) if isinstance(storage, _Storage) else None
        dtype = known[0] if known else None
        if known is None or not known[1] or self.read_storage is None or count > SMALL_TENSOR:
            return TensorStandIn(shape, dtype=dtype)
        code = known[1]
        data = self.read_storage(storage.key)
        width = struct.calcsize(code)
        values = (
            struct.unpack_from(f"<{count}{code}", data, offset * width)
            if len(data) >= (offset + count) * width
            else None
        )
        return TensorStandIn(shape, values, dtype)

    def find_class(self, module: str, name: str) -> Any:
        top = module.split(".")[0]
        if name in _REAL.get(module, ()):
            return super().find_class(module, name)
        if top == "torch":
            if name in _DTYPES or name in ("strided", "sparse_coo", "contiguous_format", "preserve_format"):
                return name  # a dtype, layout or memory format reads as its name
            if name == "Size":
                return tuple
            if name.startswith("_rebuild_tensor") or name in ("_rebuild_parameter", "_rebuild_from_type_v2"):
                return self._rebuild_tensor
            if name in _STORAGES or name == "UntypedStorage":
                return name
        if top in _INERT:
            return _stand_in_class(module, name)
        raise DeploymentError(
            f"{self.where} contains a {module}.{name} object; ckpteval reads only args, shapes and "
            "torch/megatron types from it, and builds nothing else from a checkpoint.",
        )

    def persistent_load(self, pid: Any) -> Any:
        # a torch.save zip's storage: ("storage", storage class, key, location, numel); read only on demand
        if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage":
            return _Storage(kind=str(pid[1]), key=str(pid[2]))
        return StandIn(pid)


def _load(data: bytes, where: str, read_storage: Any = None) -> Any:
    try:
        return _Unpickler(io.BytesIO(data), where, read_storage).load()
    except DeploymentError:
        raise
    except (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise DeploymentError(f"{where} cannot be read: {exc}") from None


def read_torch_save(path: Path) -> Any:
    """The object `torch.save` wrote to `path` (zip format), with torch objects as stand-ins."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if not names:
                raise DeploymentError(f"{path} is not a torch.save file (no data.pkl in it).")
            prefix = names[0][: -len("data.pkl")]

            def read_storage(key: str) -> bytes:
                return archive.read(f"{prefix}data/{key}")

            return _load(archive.read(names[0]), str(path), read_storage)
    except zipfile.BadZipFile:
        raise DeploymentError(
            f"{path} is not a torch.save zip file (written by a torch older than 1.6?).",
            hint="Re-save the checkpoint with a current Megatron-LM.",
        ) from None
    except (OSError, KeyError) as exc:
        raise DeploymentError(f"{path} cannot be read: {exc}") from None


def _index_entries(path: Path) -> dict[Any, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DeploymentError(f"The tensor index {path} cannot be read: {exc.strerror or exc}") from None
    metadata = _load(data, str(path))
    entries = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(entries, dict):
        raise DeploymentError(f"{path} is not a torch.distributed.checkpoint index.")
    return entries


def read_chunk_offsets(path: Path, key: str) -> list[tuple[int, ...]]:
    """The offsets of the chunks tensor `key` is stored in (one per rank that saved a distinct part)."""
    meta = _index_entries(path).get(key)
    chunks = getattr(meta, "chunks", None) if isinstance(meta, StandIn) else None
    return [tuple(getattr(c, "offsets", ()) or ()) for c in chunks or ()]


def read_tensor_index(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (global shape, dtype name) from a torch_dist `.metadata` file (non-tensor entries left out)."""
    entries = _index_entries(path)
    out = {}
    for key, meta in entries.items():
        if not isinstance(meta, StandIn) or not meta.qualname.endswith("TensorStorageMetadata"):
            continue
        size = getattr(meta, "size", None)
        properties = getattr(meta, "properties", None)
        out[str(key)] = (tuple(size or ()), _dtype_of(properties))
    return out


def _dtype_of(properties: Any) -> str:
    state = getattr(properties, "state", None)
    if isinstance(state, tuple) and state and isinstance(state[0], str):
        return state[0]  # TensorProperties.__getstate__: (dtype, layout, requires_grad, memory_format, pin_memory)
    dtype = getattr(properties, "dtype", None) if properties is not None else None
    return dtype if isinstance(dtype, str) else "float32"
