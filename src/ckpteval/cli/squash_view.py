"""Rich renderings of the squash plan (for `--dry-run` previews and `evaluate squash`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from ckpteval.types import SquashPlan

_STYLES = {"use": "green", "import": "yellow", "re-import": "yellow", "import if missing": "cyan"}


def squash_plan_panel(plan: SquashPlan) -> RenderableType:
    """A panel listing each image, its .sqsh path and whether it is a cache hit or an import."""
    if not plan.items:
        return Panel(Text("No container image to squash.", style="dim"), title="Squash plan", border_style="blue")
    table = Table(box=None, show_edge=False, pad_edge=False, expand=False)
    table.add_column("image", overflow="fold")
    table.add_column("used at", style="dim", overflow="fold")
    table.add_column(".sqsh on the cluster", overflow="fold")
    table.add_column("action", no_wrap=True)
    for item in plan.items:
        action = plan.action(item)
        table.add_row(item.image, "\n".join(item.dotpaths), item.path, Text(action, style=_STYLES[action]))
    build = plan.build
    where = ", ".join(
        part
        for part in (
            f"account {build.account}" if build.account else "",
            f"partition {build.partition}" if build.partition else "default partition",
            f"time {build.time}",
            f"{build.gpus_per_node} GPUs" if build.gpus_per_node else "no GPUs",
        )
        if part
    )
    checked = f"checked on {plan.host}" if plan.checked else f"not checked (add --check to ask {plan.host}, read-only)"
    footer = Text.assemble(
        ("cache: ", "dim"),
        plan.containers_dir,
        "\n",
        ("imports run: ", "dim"),
        f"srun enroot import ({where})",
        "\n",
        ("status: ", "dim"),
        checked,
    )
    return Panel(Group(table, Text(""), footer), title="Squash plan", border_style="blue")
