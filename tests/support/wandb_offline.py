"""Read a W&B offline run back: the `run-<id>.wandb` file wandb-core writes, record by record.

wandb 0.31 no longer ships a Python reader (its writer moved to Go), so this is the format's
reader, checked against every record's checksum: a LevelDB-log stream (7-byte header `:W&B`, magic
0xBEE1, version 0; 32 KiB blocks of records `crc32 (type-seeded) | length | type | data`, a record
split FIRST/MIDDLE/LAST across blocks) whose payloads are `wandb.proto.wandb_internal_pb2.Record`
messages — wandb's own protobuf, parsed with wandb's own classes.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_HEADER = struct.Struct("<4sHB")
_RECORD = struct.Struct("<IHB")
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_SEED = {t: zlib.crc32(bytes([t])) for t in (_FULL, _FIRST, _MIDDLE, _LAST)}


def raw_records(path: Path) -> list[bytes]:
    """Every record payload in the file, checksums verified."""
    data = path.read_bytes()
    ident, magic, version = _HEADER.unpack_from(data, 0)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), f"{path} is not a W&B run file"
    pos, pending, out = _HEADER.size, b"", []
    while pos + _RECORD.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _RECORD.size:  # block trailer
            pos += left
            continue
        checksum, length, kind = _RECORD.unpack_from(data, pos)
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += left
            continue
        if pos + _RECORD.size + length > len(data):
            break  # a record cut short: its writer was killed while writing it (what follows is lost)
        chunk = data[pos + _RECORD.size : pos + _RECORD.size + length]
        assert zlib.crc32(chunk, _SEED[kind]) & 0xFFFFFFFF == checksum, f"bad checksum at {pos} in {path}"
        pos += _RECORD.size + length
        if kind == _FULL:
            out.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        else:
            out.append(pending + chunk)
            pending = b""
    return out


@dataclass
class OfflineArtifact:
    name: str
    type: str
    metadata: dict[str, Any]
    files: dict[str, Path]  # path inside the artifact -> the staged copy on disk


@dataclass
class OfflineRun:
    """What an offline run recorded."""

    run_id: str = ""
    entity: str = ""
    project: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    notes: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    artifacts: list[OfflineArtifact] = field(default_factory=list)
    exit_code: int | None = None


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read_offline_run(run_dir: Path) -> OfflineRun:
    """Parse `<run_dir>/run-*.wandb` into an OfflineRun."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("run-*.wandb")
    run = OfflineRun()
    for raw in raw_records(path):
        record = pb.Record()  # type: ignore[attr-defined]
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.run_id, run.entity, run.project = r.run_id, r.entity, r.project
            run.name, run.group, run.job_type, run.notes = r.display_name, r.run_group, r.job_type, r.notes
            run.tags = list(r.tags)
            for item in r.config.update:
                run.config[_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                run.config[_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                run.summary[_key(item)] = json.loads(item.value_json)
        elif kind == "artifact":
            a = record.artifact
            files = {e.path: Path(e.local_path) for e in a.manifest.contents}
            meta = json.loads(a.metadata) if a.metadata else {}
            run.artifacts.append(OfflineArtifact(name=a.name, type=a.type, metadata=meta, files=files))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def offline_run_dirs(wandb_parent: Path) -> list[Path]:
    """The offline run directories under `<wandb_parent>/wandb/`, oldest first."""
    return sorted((wandb_parent / "wandb").glob("offline-run-*"))
