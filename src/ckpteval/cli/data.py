"""`evaluate data fetch|push`: tasks' datasets, fetched where a hub is reachable, staged on an offline cluster."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from pathlib import Path
from typing import Annotated

import typer

data_command = typer.Typer(
    name="data",
    help="Tasks' datasets: fetch them where the hub is reachable, push them to a cluster whose nodes are offline.",
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="rich",
)

ConfigOpt = Annotated[
    list[str] | None, typer.Option("-c", "--config", help="Config(s) whose tasks' datasets to use (repeatable).")
]
TaskOpt = Annotated[list[str] | None, typer.Option("-t", "--task", help="A task (repeatable); with -c: only these.")]
CacheOpt = Annotated[
    Path | None,
    typer.Option(
        "--cache", help="The dataset cache (an HF_HOME). Default: $CKPTEVAL_DATA_CACHE or ~/.cache/ckpteval/datasets."
    ),
]
EnvOpt = Annotated[Path | None, typer.Option("--env-file", help="The env.toml to read profiles from.")]


@data_command.command("fetch")
def fetch_command(
    config: ConfigOpt = None,
    task: TaskOpt = None,
    cache: CacheOpt = None,
    env_file: EnvOpt = None,
) -> None:
    """Download the datasets of the config's tasks (or the -t tasks) into the dataset cache.

    Run it where the Hugging Face Hub is reachable (HF_ENDPOINT is honoured). A dataset already in the cache
    costs nothing; one cut off half-way is fetched again.

    [bold]Examples[/]

      evaluate data fetch -c pretrain
      evaluate data fetch -t piqa -t openbookqa
    """
    from rich.console import Console

    import ckpteval

    console = Console(highlight=False, soft_wrap=True)
    result = ckpteval.fetch_data(
        config or (),
        task or (),
        cache=cache,
        env_file=env_file,
        on_note=lambda note: console.print(f"[dim]{note}[/]"),
        on_progress=lambda ref, state: console.print(f"{state:>9} {ref.key}"),
    )
    console.print(f"[green]✓[/] {len(result.fetched)} fetched, {len(result.cached)} already cached, in {result.root}")


@data_command.command("push")
def push_command(
    profile: Annotated[str, typer.Argument(metavar="PROFILE", help="The env.toml profile of the cluster.")],
    config: ConfigOpt = None,
    task: TaskOpt = None,
    cache: CacheOpt = None,
    env_file: EnvOpt = None,
) -> None:
    """Put the fetched datasets (all of them, or those of -c/-t) into ${remote_job_dir}/datasets on the cluster.

    Only what is missing there is sent; `--run`/`--batch` does the same before submitting when the profile
    says `compute_internet = false`.

    [bold]Examples[/]

      evaluate data push MY-CLUSTER
      evaluate data push MY-CLUSTER -c pretrain
    """
    from rich.console import Console

    import ckpteval

    console = Console(highlight=False, soft_wrap=True)
    result = ckpteval.push_data(
        profile,
        config or (),
        task or (),
        cache=cache,
        env_file=env_file,
        on_connect=lambda remote: console.print(f"[dim]connected to {remote.description}[/]"),
    )
    console.print(
        f"[green]✓[/] {len(result.staged)} staged, {len(result.present)} already there, in {result.remote_root} "
        f"[dim]({result.bytes_sent} bytes sent, {result.round_trips} round trips)[/]"
    )
