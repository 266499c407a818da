"""The preview every invocation shows (and all that `--dry-run` shows), as data.

Panels: where it runs (mode, profile, sources), the compiled config as YAML, then whatever later
steps add (job script, squash plan). `ckpteval.cli.preview` draws them; every string it draws goes
through the invocation's secret redaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckpteval.config.compile import CompiledConfig

SECTION_ORDER = ("run", "execution", "deployment", "target", "evaluation", "export")


def ordered(data: dict[str, Any]) -> dict[str, Any]:
    """The config's sections in reading order (run, execution, deployment, target, evaluation, export)."""
    out = {k: data[k] for k in SECTION_ORDER if k in data}
    out.update({k: v for k, v in data.items() if k not in out})
    return out


def config_yaml(compiled: CompiledConfig) -> str:
    """The compiled config as YAML, secrets redacted."""
    import yaml

    text = yaml.safe_dump(ordered(compiled.data), sort_keys=False, default_flow_style=False, width=110)
    return compiled.secrets.redact(text)


@dataclass(frozen=True)
class PreviewPanel:
    """An extra panel a later step contributes (job script, squash plan)."""

    title: str
    body: str
    language: str = "text"
    # Long, mechanical panels (the job script) are shown in full by --dry-run only; a real run names
    # them in one line, so the config and the progress stay on screen.
    full_only_in_dry_run: bool = False
    squash: Any = None  # a `ckpteval.cluster.squash.SquashPlan`, drawn as a table instead of `body`
