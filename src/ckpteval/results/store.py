"""results.json on disk: written atomically, read back by `evaluate results`."""

from __future__ import annotations

import json
from pathlib import Path

from ckpteval.errors import EvaluationError
from ckpteval.invocation.jobdir import JobDir
from ckpteval.invocation.record import write_text_atomic
from ckpteval.results.model import InvocationResults


def write_results(job_dir: Path, results: InvocationResults) -> Path:
    """Write `<job_dir>/results.json` (temp file + rename: never half-written)."""
    path = job_dir / JobDir.RESULTS
    write_text_atomic(path, json.dumps(results.to_json(), indent=2, sort_keys=False) + "\n")
    return path


def read_results(path: Path) -> InvocationResults:
    """Load a results.json."""
    try:
        return InvocationResults.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise EvaluationError(f"{path} does not exist.") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise EvaluationError(f"{path} is not a ckpteval results file: {exc}") from None
