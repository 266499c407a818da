"""`evaluate watch DIR -c CONFIG [...]`: evaluate each new checkpoint of a training; `watch status|stop RUN`."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import json
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
    "verdict": "magenta",
    "deployment": "blue",
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
    eval_timeout: Annotated[
        float | None,
        typer.Option(
            "--eval-timeout",
            metavar="S",
            help="Seconds an evaluation may take from submission before it is cancelled and counted as failed "
            "(default: twice the Slurm walltime; here 4 h).",
        ),
    ] = None,
    follow_every: Annotated[
        float | None,
        typer.Option(
            "--follow-every", metavar="S", help="Seconds between status queries of an evaluation (Slurm 30, here 5)."
        ),
    ] = None,
    stop_timeout: Annotated[
        float, typer.Option("--timeout", metavar="S", help="`stop`: seconds to wait for the watcher to end.")
    ] = 60.0,
    cancel: Annotated[
        bool,
        typer.Option("--cancel", help="`stop`: also cancel the evaluations in flight and wait until they have ended."),
    ] = False,
    env_file: Annotated[Path | None, typer.Option("--env-file", help="The env.toml to read profiles from.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="`status`: print JSON.")] = False,
    fresh_deployments: Annotated[
        bool,
        typer.Option(
            "--fresh-deployments",
            help="A fresh deployment per checkpoint, not one kept and each checkpoint loaded into it in place.",
        ),
    ] = False,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            help="Run the watcher on the cluster (--run's Slurm profile) as a CPU-only job that resubmits itself "
            "before its time limit; this command returns once it is submitted.",
        ),
    ] = False,
) -> None:
    """Evaluate each checkpoint of a running Megatron training as soon as it is completely written.

    One evaluation (one deployment, every task) per checkpoint, recorded with its iteration; the state
    survives restarts (the same command continues the same run); scores land as curves over iterations
    in W&B/MLflow (when export is on) and in `evaluate results --watch RUN`.

    [bold]Examples[/]

      evaluate watch /lustre/run42/checkpoints -c sft --run MY-CLUSTER -t adlr_mmlu -t hellaswag
      evaluate watch ./checkpoints -c tiny --every 60 --once  [dim]# here: what is there, then exit[/]
      evaluate watch /lustre/run42/checkpoints -c sft --run MY-CLUSTER --detach  [dim]# on the cluster[/]
      evaluate watch status run42-3fa2c1                      [dim]# from any shell[/]
      evaluate watch stop run42-3fa2c1 [--cancel]              [dim]# --cancel: its evaluations too[/]
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

        result = ckpteval.watch_stop(words[1], timeout=stop_timeout, cancel=cancel)
        typer.echo(result.message)
        if not result.stopped:
            raise typer.Exit(1)
        return
    if max_pending is not None and max_pending < 1:
        raise ConfigError("--max-pending must be at least 1.")
    if policy not in ("all", "latest"):
        raise ConfigError(f"--policy is all or latest, not {policy!r}.")
    if (follow_every is not None and follow_every <= 0) or (eval_timeout is not None and eval_timeout <= 0):
        raise ConfigError("--follow-every and --eval-timeout must be above 0 seconds.")
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
        follow_every=follow_every or 0.0,
        eval_timeout=eval_timeout,
        fresh_deployments=fresh_deployments,
    )
    if detach:
        if once:
            raise ConfigError("--detach and --once do not go together: a watcher on the cluster runs until stopped.")
        _detach(spec, dry_run=dry_run)
        return
    if dry_run:
        _dry_run(spec)
        return
    _watch(spec, once=once)


def _detach(spec: Any, *, dry_run: bool) -> None:
    import ckpteval

    console = _console()
    if dry_run:
        from rich.syntax import Syntax

        hosted = ckpteval.watch_detach_dry_run(spec)
        console.print(f"watch run [bold]{hosted.run}[/]: the watcher would live in {hosted.home} on the cluster")
        console.print("[bold]watcher.sbatch[/] (submitted with sbatch; nothing submitted now):")
        console.print(Syntax(hosted.script, "bash", word_wrap=True))
        console.print("[bold]env.toml[/] there (the profile, reached locally on the cluster):")
        console.print(Syntax(hosted.env_toml, "toml", word_wrap=True))
        return
    submitted = ckpteval.watch_detach(spec)
    console.print(
        f"watch run [bold]{submitted.run}[/]: its watcher is Slurm job {submitted.job_id} on {submitted.where} "
        f"(files and state in {submitted.home}); it resubmits itself before its time limit.\n"
        f"`evaluate watch status {submitted.run}` shows it, `evaluate watch stop {submitted.run}` ends it."
    )


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

    def on_start(watcher: Any) -> None:
        state = watcher.state
        done = sum(1 for e in state.iterations.values() if e.state == "succeeded")
        console.print(
            f"watching [bold]{escape(spec.save_dir)}[/] as run [bold]{state.run}[/] "
            f"(every {spec.every:g} s, evaluations followed every {spec.follow_every:g} s and given up after "
            f"{spec.eval_timeout:g} s, policy {spec.policy}, at most {spec.max_pending} pending"
            + (f"; {done} iteration(s) already evaluated" if done else "")
            + ")"
        )

    try:
        outcome = ckpteval.watch(spec, once=once, on_event=on_event, on_start=on_start)
    except KeyboardInterrupt:
        console.print("stopped; start the same command again to go on")
        raise typer.Exit(130) from None
    summary = f"watch run {outcome.run} {'stopped' if outcome.ended == 'stopped' else 'done'}: "
    summary += f"{len(outcome.succeeded)} evaluated"
    if outcome.failed:
        summary += f", [red]gave up on iteration(s) {', '.join(map(str, outcome.failed))}[/]"
    if outcome.unfinished:
        what = "not finished" if outcome.ended == "done" else "still open (the next watcher goes on with them)"
        summary += f", {what}: iteration(s) {', '.join(map(str, outcome.unfinished))}"
    console.print(summary + f"; curves: `evaluate results --watch {outcome.run}`")
    if outcome.exit_status:
        raise typer.Exit(outcome.exit_status)


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
    if result.deployment is not None:
        console.print(escape(result.deployment.line))
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

    hosted = ckpteval.watch_hosted(run) if run else None
    if hosted is not None:
        _hosted_status(ckpteval.watch_hosted_status(hosted), json_output=json_output)
        return
    runs = ckpteval.watch_runs(run)
    if json_output:
        print(json.dumps([r.to_json() for r in runs], indent=2))
        return
    console = _console()
    on_cluster = ckpteval.watch_hosted_runs() if not run else []
    if on_cluster:
        console.print(f"on a cluster (--detach; `evaluate watch status RUN` asks it): {', '.join(on_cluster)}")
    if not runs:
        if not on_cluster:
            console.print("No watch runs recorded yet. Start one with `evaluate watch DIR -c CONFIG`.")
        return
    from rich.table import Table

    if run:
        _run_status(console, runs[0].state, runs[0].health)
        return
    table = Table(header_style="bold")
    for col in ("run", "save dir", "watching", "evaluated", "in flight", "failed"):
        table.add_column(col)
    for r in runs:
        s = r.state
        counts = {
            k: sum(1 for e in s.iterations.values() if e.state == k) for k in ("succeeded", "submitted", "failed")
        }
        table.add_row(
            s.run,
            s.spec.save_dir,
            "yes" if r.watching else "no",
            str(counts["succeeded"]),
            str(counts["submitted"]),
            str(counts["failed"]),
        )
    console.print(table)


def _hosted_status(status: Any, *, json_output: bool) -> None:
    from rich.markup import escape

    if json_output:
        print(json.dumps(status.to_json(), indent=2))
        return
    console = _console()
    running = [j for j in status.jobs if j.state == "RUNNING"]
    if running:
        j = running[-1]
        watcher = f"[green]watching[/] (Slurm job {j.job_id} RUNNING on {j.node})"
    elif status.jobs:
        j = status.jobs[-1]
        watcher = f"[yellow]queued[/] (Slurm job {j.job_id} {j.state}{f', {j.reason}' if j.reason else ''})"
    else:
        watcher = "[yellow]not running[/] (no watcher job on the cluster)"
    links = f"{len(status.links)} link(s) of the chain so far" if status.links else "no link submitted"
    console.print(f"[bold]{status.ref.run}[/]  {watcher}  on {status.where}:{escape(status.ref.home)}; {links}")
    if status.state is None:
        console.print("it has not written its state yet")
        return
    _run_status(console, status.state, status.health, watcher_line=False)


def _run_status(console: Any, state: Any, h: Any, *, watcher_line: bool = True) -> None:
    from rich.markup import escape
    from rich.table import Table

    from ckpteval.views import verdict_lines

    now = time.time()
    if watcher_line:
        console.print(f"[bold]{state.run}[/]  {_watcher_words(h, now)}  {escape(state.spec.save_dir)}")
    polls = f"profile {state.spec.profile or 'local'}; {state.polls} polls, last {_ago(h.last_poll, now)}"
    if h.next_poll:
        polls += f", next in {max(0.0, h.next_poll - now):.0f} s"
    if h.last_follow:
        polls += f"; evaluations last followed {_ago(h.last_follow, now)}"
    console.print(polls)
    for f in h.in_flight:
        errors = f", {f.status_errors} status error(s) in a row" if f.status_errors else ""
        console.print(
            f"in flight: iteration {f.iteration}, {f.invocation} ({f.state}, for {f.age_s / 60:.1f} min{errors})"
        )
    for line in h.errors:
        console.print(f"[red]error[/] {escape(line)}")
    table = Table(header_style="bold")
    for col in ("iteration", "state", "invocation", "attempts", "note"):
        table.add_column(col)
    for i in sorted(state.iterations):
        e = state.iterations[i]
        table.add_row(str(i), e.state, e.current.invocation if e.current else "", str(len(e.attempts)), e.note)
    console.print(table)
    judged = [e for _, e in sorted(state.iterations.items()) if e.verdicts]
    if judged:
        console.print("[bold]Is it better?[/] (paired test on the documents both scored; see docs/compare.md)")
    for e in judged:
        for line in verdict_lines(e):
            console.print(f"  iteration {e.iteration} {escape(line)}")


def _watcher_words(h: Any, now: float) -> str:
    if not h.alive:
        return "[yellow]not running[/]" + (f" (last watcher on {h.host})" if h.host else "")
    where = f" on {h.host}" if h.host else ""
    watcher = f"[green]watching[/] (process {h.pid}{where}, since {_clock(h.since)})"
    if h.overdue:
        watcher += f" [bold red]but its poll is overdue since {_ago(h.next_poll, now)}[/]"
    return watcher


def _clock(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"


def _ago(t: float | None, now: float) -> str:
    if not t:
        return "never"
    seconds = max(0.0, now - t)
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"
