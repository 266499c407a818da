"""`evaluate report ID... -o report.html`: one self-contained HTML report; `--png DIR` writes its charts as PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ckpteval.errors import ConfigError


def report_command(
    invocations: Annotated[
        list[str] | None, typer.Argument(help="Invocation ids (or prefixes); the first is the baseline.")
    ] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path("report.html"),
    watch: Annotated[
        list[str] | None,
        typer.Option("--watch", metavar="RUN", help="A watch run's scores against iteration (repeatable)."),
    ] = None,
    png: Annotated[
        Path | None, typer.Option("--png", help="Also write each task's chart as <DIR>/<task>.png (for papers).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the comparison's resampling.")] = 0,
) -> None:
    """Write one HTML file (no network needed to open it): the score table with standard errors and 95 %
    intervals, a bar chart per task, for two or more invocations each one's comparison with the first, and
    for each `--watch RUN` its scores against iteration."""
    from ckpteval.invocation.record import now_iso, write_text_atomic
    from ckpteval.report.charts import bar_chart, write_png
    from ckpteval.report.html import render_report
    from ckpteval.results.compare import compare
    from ckpteval.results.load import invocation_samples

    if not invocations and not watch:
        raise ConfigError(
            "Name the invocation(s) or watch run(s) to report.",
            hint="evaluate report ID [ID...] [--watch RUN] -o report.html; `evaluate status` lists invocations.",
        )
    if output.is_dir():
        raise ConfigError(f"--output {output} is a directory.", hint="Give a file name, e.g. -o report.html.")
    loaded = [invocation_samples(i) for i in invocations or ()]
    results = [x.results for x in loaded]
    comparison = compare(loaded[0], loaded[1:], seed=seed) if len(loaded) > 1 else None
    states = _watch_states(watch or ())
    curves = [c for state in states for c in _curves(state)]
    output.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output, render_report(results, comparison, generated=now_iso(), curves=curves))
    typer.echo(f"wrote {output}")
    if png is not None:
        tasks = list(dict.fromkeys(t for r in results for t in r.tasks))
        for task in tasks:
            chart = bar_chart(task, results)
            if chart is not None:
                typer.echo(f"wrote {write_png(chart, png / f'{task}.png')}")
        from ckpteval.watch.curves import plot_curves

        for state in states:
            if _curves(state):
                typer.echo(f"wrote {plot_curves(state, png / f'watch-{state.run}.png')}")


def _watch_states(runs: list[str] | tuple[str, ...]) -> list[Any]:
    from ckpteval.watch.state import find_run

    return [find_run(run) for run in runs]


def _curves(state: Any) -> list[Any]:
    from ckpteval.report.charts import watch_curves
    from ckpteval.watch.curves import curve_rows, score_columns

    return watch_curves(state.run, curve_rows(state), score_columns(state))
