"""The preview every invocation shows (and all that `--dry-run` shows).

Panels: where it runs (mode, profile, sources), the compiled config as YAML, then whatever later
steps add (job script, squash plan). Every string goes through the invocation's secret redaction.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    renderable: Any = None  # a ready rich renderable (e.g. the squash plan table), shown instead of `body`


def render_preview(
    compiled: CompiledConfig,
    *,
    invocation: str | None = None,
    panels: Sequence[PreviewPanel] = (),
    dry_run: bool = False,
) -> None:
    """Print the preview: summary, compiled config, extra panels."""
    from rich.console import Console, Group
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.table import Table

    console = Console(soft_wrap=False)
    redact = compiled.secrets.redact
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    mode = {"local": "this machine (attached)", "run": "attached", "batch": "detached"}[compiled.mode]
    summary.add_row("mode", mode + (" — dry run, nothing will be done" if dry_run else ""))
    summary.add_row("profile", f"{compiled.profile.name} ({compiled.profile.executor})")
    if compiled.env_file:
        summary.add_row("env.toml", str(compiled.env_file))
    if invocation:
        summary.add_row("invocation", invocation)
    sources = ["default", *(str(p) for p in compiled.config_files)]
    summary.add_row("configs", " < ".join(sources))
    if compiled.request.overrides:
        summary.add_row("overrides", redact(" ".join(compiled.request.overrides)))
    summary.add_row("tasks", ", ".join(t.name for t in compiled.tasks))
    for note in compiled.notes:
        summary.add_row("note", note)
    console.print(Panel(summary, title="[bold green]evaluate[/]", border_style="green", expand=False))
    console.print(
        Panel(
            Syntax(config_yaml(compiled), "yaml", theme="ansi_dark", background_color="default"),
            title="[bold green]compiled config[/]",
            border_style="green",
            expand=False,
        )
    )
    for panel in panels:
        if panel.full_only_in_dry_run and not dry_run:
            console.print(f"[bold green]{panel.title}[/] [dim](shown in full by --dry-run)[/]")
            continue
        if panel.renderable is not None:
            console.print(panel.renderable)
            continue
        # scripts have long command lines: wrap them rather than crop them at the panel's edge
        body: Any = Syntax(
            redact(panel.body), panel.language, theme="ansi_dark", background_color="default", word_wrap=True
        )
        console.print(Panel(Group(body), title=f"[bold green]{panel.title}[/]", border_style="green", expand=False))
