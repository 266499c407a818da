"""An export that is checked before it is used: `export_checked` = `export_checkpoint` then `check_parity`.

A passed check is kept beside the export (PARITY_FILE), so an export found again for the same checkpoint
content is not checked again; a failed one refuses with what differs and is not kept.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.hfexport.write import HfExport

PARITY_FILE = "ckpteval_parity.json"


@dataclass(frozen=True)
class CheckedExport:
    """An export and its parity check (`parity` None: not checked, at the caller's request)."""

    export: HfExport
    parity: dict[str, Any] | None  # ParityReport.provenance() of a passed check
    parity_reused: bool = False

    def provenance(self) -> dict[str, Any]:
        """What results.json keeps of it."""
        return {"export": self.export.provenance(), "parity": self.parity, "parity_reused": self.parity_reused}


def export_checked(
    checkpoint: str | Path,
    output: str | Path,
    *,
    dtype: str = "checkpoint",
    tokenizer: str | None = None,
    force: bool = False,
    check: bool = True,
) -> CheckedExport:
    """Export `checkpoint` to `output` (or find it there) and prove it computes what the checkpoint computes;
    DeploymentError naming what differs when it does not."""
    from ckpteval.hfexport.parity import check_parity
    from ckpteval.hfexport.write import export_checkpoint

    export = export_checkpoint(checkpoint, output, dtype=dtype, tokenizer=tokenizer, force=force)
    if not check:
        return CheckedExport(export=export, parity=None)
    kept = _kept_parity(export)
    if kept is not None:
        return CheckedExport(export=export, parity=kept, parity_reused=True)
    report = check_parity(export.checkpoint, export.output, tokenizer=tokenizer)
    report.refuse()
    parity = report.provenance()
    staging = export.output / f".{PARITY_FILE}.{os.getpid()}"  # renamed into place: a reader never sees half
    staging.write_text(json.dumps({"identity": export.identity, **parity}, indent=2) + "\n", encoding="utf-8")
    os.replace(staging, export.output / PARITY_FILE)
    return CheckedExport(export=export, parity=parity)


def _kept_parity(export: HfExport) -> dict[str, Any] | None:
    if not export.reused:
        return None
    try:
        kept = json.loads((export.output / PARITY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.pop("identity", None) != export.identity or not kept.get("passed"):
        return None
    return kept
