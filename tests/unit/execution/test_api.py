"""The Python API: `import ckpteval` stays light, and `run` reports events instead of printing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ckpteval
from ckpteval.execution.events import Preview


def test_import_ckpteval_loads_no_front_end_and_no_heavy_dependency():
    heavy = "('rich', 'typer', 'click', 'torch', 'nemo_run', 'wandb', 'hydra')"
    probe = f"import sys, ckpteval; ckpteval.run; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_a_dry_run_reports_the_preview_and_prints_nothing(isolated_user: Path, capsys: pytest.CaptureFixture[str]):
    events: list[object] = []
    outcome = ckpteval.run(configs=["tiny"], dry_run=True, reporter=events.append)
    assert (outcome.state, outcome.exit_status, outcome.record) == ("dry-run", 0, None)
    (preview,) = [e for e in events if isinstance(e, Preview)]
    assert preview.invocation == outcome.invocation and preview.dry_run
    # -c tiny prepares SmolLM2 in the job: its checkpoint is described first when a run already prepared it
    titles = [p.title.split()[:2] for p in preview.panels]
    assert titles[-1] == ["job", "script"] and all(t == ["checkpoint,", "served"] for t in titles[:-1])
    assert "bash" in preview.panels[-1].body and "adlr_mmlu" in preview.panels[-1].body
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_batch_on_this_machine_is_refused_before_anything_is_written(isolated_user: Path):
    with pytest.raises(ckpteval.ConfigError) as err:
        ckpteval.run(configs=["tiny"], profile="local", mode="batch")
    assert "--batch" in err.value.message
    assert ckpteval.statuses() == []


def test_results_and_export_are_the_api_functions_though_subpackages_share_their_names():
    probe = (
        "import ckpteval, ckpteval.results.model, ckpteval.export.invocation; "
        "from ckpteval.results.store import read_results; "
        "print(ckpteval.results.__module__, ckpteval.export.__module__, ckpteval.status.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["ckpteval.api"] * 3
