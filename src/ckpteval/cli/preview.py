"""Draw the preview (`ckpteval.types.PreviewPanel`s) with rich: summary, compiled config, extra panels."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from collections.abc import Sequence
from typing import Any

from ckpteval.types import CompiledConfig, PreviewPanel
from ckpteval.views import config_yaml


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
        if panel.squash is not None:
            from ckpteval.cli.squash_view import squash_plan_panel

            console.print(squash_plan_panel(panel.squash))
            continue
        # scripts have long command lines: wrap them rather than crop them at the panel's edge
        body: Any = Syntax(
            redact(panel.body), panel.language, theme="ansi_dark", background_color="default", word_wrap=True
        )
        console.print(Panel(Group(body), title=f"[bold green]{panel.title}[/]", border_style="green", expand=False))
