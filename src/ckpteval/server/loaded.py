"""What the server actually loaded, reported by the server itself: the source of truth for results.

The checkpoint a job plans to serve is described before submission, but what counts is what the server read
when it loaded: which directory, which iteration, the content identity of the files it read
(`ckpteval.checkpoint.identity.content_identity`), the architecture the args gave it, the tokenizer it serves
with, its device and dtype. `LoadedReport` holds that; the server writes it (`--report-file`, the job's
`state/served_checkpoint.json`) as soon as it serves, reports it in `/v1/health` under `checkpoint`, and
names the content identity on every response (`ckpteval.server.identity.CHECKPOINT_HEADER`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.checkpoint.identity import ContentIdentity, content_identity
from ckpteval.checkpoint.layout import iteration_label


@dataclass(frozen=True)
class LoadedReport:
    """The checkpoint a server loaded (see the module docstring); plain JSON values."""

    path: str  # the iteration directory read
    root: str
    iteration: str  # "1000" or "release"
    pinned: str | None  # the iteration the job asked for (`--iteration`), None: the tracker's
    content: ContentIdentity
    architecture: dict[str, Any]  # the args as served (`ModelArchitecture`'s fields)
    tokenizer_dir: str
    device: str
    dtype: str
    in_place: bool = False  # loaded into a server that served another checkpoint before (`server.inplace`)

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["content"] = self.content.to_json()
        return data


def loaded_report(info: Any, *, pinned: str | None, device: str, dtype: str) -> LoadedReport:
    """The report of a loaded checkpoint (`info`: `server.checkpoint.CheckpointInfo`); reads every file of its
    iteration directory once more (from the page cache, right after the load) for the content identity."""
    return LoadedReport(
        path=str(info.iter_dir),
        root=str(info.root),
        iteration=iteration_label(info.layout.iteration),
        pinned=pinned,
        content=content_identity(info.iter_dir),
        architecture=_plain(dataclasses.asdict(info.architecture)),
        tokenizer_dir=str(info.tokenizer_dir),
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
    )


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write a report (`LoadedReport.to_json`) to `path` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    """JSON-ready: dtypes, enums and paths in words."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
