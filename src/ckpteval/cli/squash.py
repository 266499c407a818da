"""`evaluate squash IMAGE --run PROFILE`: put a Docker image into the cluster's .sqsh cache by hand."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Self

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from ckpteval.types import SquashEvent


def squash_command(
    images: Annotated[
        list[str],
        typer.Argument(
            metavar="IMAGE", help="Docker image reference(s), e.g. nvcr.io/nvidia/nemo:25.09.", show_default=False
        ),
    ],
    run: Annotated[
        str,
        typer.Option("-r", "--run", metavar="PROFILE", help="The env.toml profile of the cluster.", show_default=False),
    ],
    force: Annotated[bool, typer.Option("--force", help="Re-import even if the .sqsh exists.")] = False,
    dry_run: Annotated[
        bool, typer.Option("-d", "--dry-run", help="Show which images go where; connect to nothing.")
    ] = False,
    check: Annotated[
        bool, typer.Option("--check", help="With --dry-run: ask the cluster, read-only, which .sqsh files exist.")
    ] = False,
    env_file: Annotated[Path | None, typer.Option("--env-file", help="The env.toml to read profiles from.")] = None,
) -> None:
    """Squash Docker images into .sqsh files in the cluster's cache, as `--run` does before it submits.

    The files go to ${remote_job_dir}/containers/ on the cluster. An image already there costs one round trip.

    `enroot import` runs on a compute node (srun with the profile's account and build_partition/build_time).

    [bold]Examples[/]

      evaluate squash nvcr.io/nvidia/nemo:25.09 --run MY-CLUSTER
      evaluate squash nvcr.io/nvidia/nemo:25.09 --run MY-CLUSTER --dry-run --check
    """
    from rich.console import Console

    import ckpteval
    from ckpteval.cli.squash_view import squash_plan_panel
    from ckpteval.errors import ConfigError

    console = Console(highlight=False, soft_wrap=True)
    if check and not dry_run:
        ckpteval.squash_plan(images, run, env_file=env_file)  # a bad profile or image is said first
        raise ConfigError("--check goes with --dry-run.", hint="Add --dry-run, or drop --check.")
    if dry_run:
        console.print(squash_plan_panel(ckpteval.squash_plan(images, run, check=check, force=force, env_file=env_file)))
        return

    start = time.monotonic()
    with SquashProgress(console) as progress:
        result = ckpteval.squash(
            images,
            run,
            force=force,
            env_file=env_file,
            on_event=progress.on_event,
            on_connect=lambda remote: console.print(f"[dim]connected to {remote.description}[/]"),
        )
    for item in result.plan.items:
        took = result.import_seconds.get(item.image)
        how = f"imported in {took:.1f} s" if took is not None else "cache hit"
        console.print(f"[green]✓[/] {item.image} -> {item.path} [dim]({how})[/]")
    console.print(f"[dim]done in {time.monotonic() - start:.1f} s[/]")


class SquashProgress:
    """Shows what an import is doing: enroot's [INFO] lines as they come, and a live elapsed time.

    Pass `progress.on_event` as `on_event` to `ensure_squashed`, inside `with progress:`.
    """

    def __init__(self, console: Console) -> None:
        from rich.live import Live

        self._console = console
        self._current = ""
        self._started = 0.0
        self._last = ""
        self._live = Live(self, console=console, refresh_per_second=4, transient=True) if console.is_terminal else None

    def __enter__(self) -> Self:
        if self._live:
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self._live.stop()

    def __rich__(self) -> str:
        if not self._current:
            return ""
        return f"[yellow]⠿[/] importing {self._current} [dim]{time.monotonic() - self._started:.0f} s  {self._last}[/]"

    def on_event(self, event: SquashEvent) -> None:
        from rich.markup import escape

        name = escape(event.item.image) if event.item else ""
        if event.kind == "importing":
            self._current, self._started, self._last = name, time.monotonic(), ""
            self._console.print(f"importing {name} on a compute node ...")
        elif event.kind == "waiting":
            self._console.print(f"[yellow]waiting[/] for another invocation importing {name} ...")
        elif event.kind == "output":
            self._last = escape(event.text)
            self._console.print(f"  [dim]{event.elapsed:5.1f}s {escape(event.text)}[/]")
        elif event.kind in ("imported", "hit"):
            self._current = ""
