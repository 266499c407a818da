"""`evaluate data fetch|push`: tasks' datasets, fetched where a hub is reachable, staged on an offline cluster."""

from __future__ import annotations

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

    from ckpteval.config.data_select import datasets_of
    from ckpteval.tasks.data_cache import fetch_datasets

    console = Console(highlight=False, soft_wrap=True)
    refs, notes = datasets_of(config or [], task or [], env_file=env_file)
    for note in notes:
        console.print(f"[dim]{note}[/]")
    result = fetch_datasets(refs, cache, on_progress=lambda ref, state: console.print(f"{state:>9} {ref.key}"))
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

    from ckpteval.cluster.connect import connect_remote
    from ckpteval.cluster.data_push import datasets_dir, push_datasets
    from ckpteval.config.data_select import datasets_of
    from ckpteval.config.profiles import load_env_file
    from ckpteval.errors import ConfigError
    from ckpteval.tasks.data_cache import cached_datasets, default_cache_dir, is_cached

    console = Console(highlight=False, soft_wrap=True)
    env_profile = load_env_file(env_file).profile(profile)
    if env_profile.executor != "slurm":
        raise ConfigError(f"Profile [{profile}] does not run on a Slurm cluster.", hint="Name a Slurm profile.")
    remote_root = datasets_dir(env_profile)  # remote_job_dir set and absolute, before connecting
    root = cache or default_cache_dir()
    if config or task:
        refs, _ = datasets_of(config or [], task or [], env_file=env_file)
        missing = [ref for ref in refs if not is_cached(root, ref)]
        if missing:
            raise ConfigError(
                f"{len(missing)} of these datasets are not fetched yet (first: {missing[0].key}).",
                hint="Fetch them first: evaluate data fetch "
                + " ".join([*(f"-c {c}" for c in config or []), *(f"-t {t}" for t in task or [])]),
            )
    else:
        refs = cached_datasets(root)
    with connect_remote(env_profile) as remote:
        console.print(f"[dim]connected to {remote.description}[/]")
        result = push_datasets(remote, remote_root, refs, root)
    console.print(
        f"[green]✓[/] {len(result.staged)} staged, {len(result.present)} already there, in {remote_root} "
        f"[dim]({result.bytes_sent} bytes sent, {result.round_trips} round trips)[/]"
    )
