"""`evaluate watch DIR -c CONFIG [...]`: evaluate each new checkpoint of a training; `watch status|stop RUN`."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import json
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ckpteval.errors import ConfigError

_EVENT_STYLE = {
    "ready": "cyan",
    "incomplete": "dim",
    "submitted": "bold",
    "succeeded": "green",
    "retry": "yellow",
    "failed": "bold red",
    "skipped": "yellow",
    "exported": "dim",
    "error": "red",
}


def watch_command(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="DIR [OVERRIDES]... | status [RUN] | stop RUN",
            help="The Megatron save directory to watch (then Hydra overrides); or `status`/`stop` and a run.",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        list[str] | None,
        typer.Option("-c", "--config", metavar="NAME|PATH", help="A stage config or YAML path (repeatable)."),
    ] = None,
    run: Annotated[
        str | None,
        typer.Option("-r", "--run", metavar="PROFILE", help="The env.toml profile the evaluations run on."),
    ] = None,
    task: Annotated[
        list[str] | None, typer.Option("-t", "--task", metavar="TASK", help="Evaluate only this task (repeatable).")
    ] = None,
    every: Annotated[float, typer.Option("--every", metavar="S", help="Seconds between two polls.")] = 300.0,
    once: Annotated[
        bool, typer.Option("--once", help="Evaluate the checkpoints that are ready now, wait for them, exit.")
    ] = False,
    policy: Annotated[
        str, typer.Option("--policy", help="all: evaluate every checkpoint; latest: when behind, only the newest.")
    ] = "all",
    max_pending: Annotated[
        int | None,
        typer.Option("--max-pending", metavar="N", help="Evaluations queued or running at once (Slurm 4, here 1)."),
    ] = None,
    max_attempts: Annotated[
        int, typer.Option("--max-attempts", metavar="N", help="Evaluations of a checkpoint before giving up.")
    ] = 3,
    wandb_run_id: Annotated[
        str | None,
        typer.Option("--wandb-run-id", metavar="ID", help="Log the curves into this W&B run (the training's own)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("-d", "--dry-run", help="Show what would be evaluated now and its job; do nothing.")
    ] = False,
    env_file: Annotated[Path | None, typer.Option("--env-file", help="The env.toml to read profiles from.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="`status`: print JSON.")] = False,
) -> None:
    """Evaluate each checkpoint of a running Megatron training as soon as it is completely written.

    One evaluation (one deployment, every task) per checkpoint, recorded with its iteration; the state
    survives restarts (the same command continues the same run); scores land as curves over iterations
    in W&B/MLflow (when export is on) and in `evaluate results --watch RUN`.

    [bold]Examples[/]

      evaluate watch /lustre/run42/checkpoints -c sft --run MY-CLUSTER -t adlr_mmlu -t hellaswag
      evaluate watch ./checkpoints -c tiny --every 60 --once  [dim]# here: what is there, then exit[/]
      evaluate watch status run42-3fa2c1                      [dim]# from any shell[/]
      evaluate watch stop run42-3fa2c1
    """
    words = list(args or [])
    if not words:
        raise ConfigError("Name the save directory to watch.", hint="evaluate watch DIR -c CONFIG [--run PROFILE]")
    if words[0] == "status" and not Path("status").is_dir():
        _status(words[1] if len(words) > 1 else None, json_output=json_output)
        return
    if words[0] == "stop" and not Path("stop").is_dir():
        if len(words) != 2:
            raise ConfigError("`evaluate watch stop` takes one watch run.", hint="`evaluate watch status` lists them.")
        import ckpteval

        typer.echo(ckpteval.watch_stop(words[1]))
        return
    if max_pending is not None and max_pending < 1:
        raise ConfigError("--max-pending must be at least 1.")
    if policy not in ("all", "latest"):
        raise ConfigError(f"--policy is all or latest, not {policy!r}.")
    from ckpteval.types import WatchSpec

    spec = WatchSpec(
        save_dir=words[0],
        configs=list(config or ()),
        profile=run,
        tasks=list(task or ()),
        overrides=words[1:],
        env_file=str(env_file) if env_file else None,
        every=every,
        policy=policy,  # type: ignore[arg-type]
        max_pending=max_pending if max_pending is not None else 0,
        max_attempts=max_attempts,
        wandb_run_id=wandb_run_id,
    )
    if dry_run:
        _dry_run(spec)
        return
    _watch(spec, once=once)


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def _watch(spec: Any, *, once: bool) -> None:
    from rich.markup import escape

    import ckpteval

    console = _console()

    def on_event(event: Any) -> None:
        style = _EVENT_STYLE.get(event.kind, "")
        stamp = time.strftime("%H:%M:%S")
        console.print(f"[dim]{stamp}[/] [{style}]{escape(event.message)}[/]" if style else escape(event.message))

    stopping = {"asked": False}

    def on_term(_signum: int, _frame: Any) -> None:
        stopping["asked"] = True

    def on_start(state: Any) -> None:
        started["run"] = state.run
        done = sum(1 for e in state.iterations.values() if e.state == "succeeded")
        console.print(
            f"watching [bold]{escape(spec.save_dir)}[/] as run [bold]{state.run}[/] "
            f"(every {spec.every:g} s, policy {spec.policy}, at most {spec.max_pending} pending"
            + (f"; {done} iteration(s) already evaluated" if done else "")
            + ")"
        )

    started: dict[str, str] = {}
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        state = ckpteval.watch(
            spec, once=once, on_event=on_event, should_stop=lambda: stopping["asked"], on_start=on_start
        )
    except KeyboardInterrupt:
        console.print(f"stopped; start the same command again to go on (run {started.get('run', '')})")
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = [e.iteration for e in state.iterations.values() if e.state == "failed"]
    console.print(f"watch run {state.run}: see the curves with `evaluate results --watch {state.run}`")
    if failed:
        console.print(f"[red]gave up on iteration(s) {', '.join(map(str, sorted(failed)))}[/]")
        raise typer.Exit(1)


def _dry_run(spec: Any) -> None:
    from rich.markup import escape

    import ckpteval

    result = ckpteval.watch_dry_run(spec)
    console = _console()
    listing = result.listing
    console.print(f"watch run [bold]{result.run}[/]: {escape(listing.save_dir)}")
    if not listing.exists:
        console.print("[yellow]the save directory does not exist (yet)[/]")
    for ckpt in listing.checkpoints:
        recorded = result.already.get(ckpt.iteration)
        if recorded:
            what = f"recorded: {recorded}"
        elif ckpt.ready:
            what = "ready: [bold]would evaluate now[/]" if ckpt.iteration in result.would_evaluate else "ready"
        else:
            what = f"[dim]incomplete (missing {', '.join(ckpt.missing)})[/]"
        console.print(f"  iteration {ckpt.iteration:>9}  {what}")
    if not result.would_evaluate:
        console.print("nothing to evaluate now")
        return
    console.print(
        f"would evaluate now: iteration {', '.join(map(str, result.would_evaluate))} "
        f"(at most {spec.max_pending} at a time); the job of the first:"
    )
    assert result.preview is not None
    compiled, invocation, panels = result.preview
    from ckpteval.cli.preview import render_preview

    render_preview(compiled, invocation=invocation, panels=panels, dry_run=True)


def _status(run: str | None, *, json_output: bool) -> None:
    import ckpteval

    runs = ckpteval.watch_runs(run)
    if json_output:
        print(json.dumps([r.to_json() for r in runs], indent=2))
        return
    console = _console()
    if not runs:
        console.print("No watch runs recorded yet. Start one with `evaluate watch DIR -c CONFIG`.")
        return
    from rich.table import Table

    if run:
        state, alive = runs[0].state, runs[0].watching
        console.print(
            f"[bold]{state.run}[/]  {'watching' if alive else 'not running'}  {state.spec.save_dir}"
            f"  (profile {state.spec.profile or 'local'}, {state.polls} polls)"
        )
        table = Table(header_style="bold")
        for col in ("iteration", "state", "invocation", "attempts", "note"):
            table.add_column(col)
        for i in sorted(state.iterations):
            e = state.iterations[i]
            table.add_row(str(i), e.state, e.current.invocation if e.current else "", str(len(e.attempts)), e.note)
        console.print(table)
        return
    table = Table(header_style="bold")
    for col in ("run", "save dir", "watching", "evaluated", "in flight", "failed"):
        table.add_column(col)
    for s, watching in ((r.state, r.watching) for r in runs):
        counts = {
            k: sum(1 for e in s.iterations.values() if e.state == k) for k in ("succeeded", "submitted", "failed")
        }
        table.add_row(
            s.run,
            s.spec.save_dir,
            "yes" if watching else "no",
            str(counts["succeeded"]),
            str(counts["submitted"]),
            str(counts["failed"]),
        )
    console.print(table)
