"""`evaluate --help`: the default action's usage, examples and options, then the subcommands."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table


def render_root_help(ctx: Any, commands: dict[str, tuple[str, str, str]]) -> None:
    """Print the help of `evaluate`: what the default action does and which commands exist."""
    default = ctx.command.get_command(ctx, "run")
    # A bare context: parsing (make_context) would coerce every option's default, which makes Typer
    # build pydantic validators — 0.2 s of imports `--help` does not need.
    sub_ctx = type(ctx)(default, info_name="evaluate")
    default.format_help(sub_ctx, None)  # Typer's rich help prints directly and ignores the formatter
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for name, (_, _, summary) in commands.items():
        table.add_row(name, summary)
    console = Console()
    console.print(Panel(table, title="Commands", title_align="left", border_style="dim"))
    console.print(" Run [bold]evaluate COMMAND --help[/] for a command's own options.")
    console.print(" Shell completion of commands, profiles and task names: [bold]evaluate --install-completion[/]")
