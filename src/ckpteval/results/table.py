"""The score table: one row per task metric; several invocations side by side.

Tasks scored on offline stand-in data (a different split, or few-shot examples from elsewhere) carry a
mark and a footnote, so no one mistakes an offline smoke score for the published number.
"""

from __future__ import annotations

from collections.abc import Sequence

from ckpteval.results.model import InvocationResults, Metric, TaskOutcome

OFFLINE_MARK = "†"


def _fmt(metric: Metric | None) -> str:
    if metric is None:
        return "—"
    text = f"{metric.value:.4f}"
    if metric.stderr is not None:
        text += f" ± {metric.stderr:.4f}"
    return text


def table_rows(results: Sequence[InvocationResults]) -> tuple[list[str], list[list[str]], list[str]]:
    """(header, rows, footnotes) of the score table for one or more invocations."""
    header = ["task", "metric", *(r.label or r.invocation for r in results), "n"]
    task_names: list[str] = []
    for r in results:
        task_names.extend(t for t in r.tasks if t not in task_names)
    rows: list[list[str]] = []
    footnotes: list[str] = []
    for task in task_names:
        outcomes = [r.tasks.get(task) for r in results]
        metric_names: list[str] = []
        for o in outcomes:
            if o:
                metric_names.extend(m for m in o.metrics if m not in metric_names)
        label = task
        offline = next((o for o in outcomes if o and o.data and o.data.offline), None)
        if offline and offline.data:
            label = f"{task} {OFFLINE_MARK}"
            d = offline.data
            parts = [
                p
                for p in (
                    d.source,
                    f"split {d.split}" if d.split else None,
                    f"few-shot from {d.few_shot_source}" if d.few_shot_source else None,
                    d.note,
                )
                if p
            ]
            footnotes.append(f"{OFFLINE_MARK} {task}: offline data — " + "; ".join(parts))
        if not metric_names:
            rows.append([label, _status_text(outcomes), *("—" for _ in outcomes), ""])
            continue
        for i, metric in enumerate(metric_names):
            values = [
                _fmt(o.metrics.get(metric)) if o and o.status == "succeeded" else _status_cell(o) for o in outcomes
            ]
            n = next(
                (
                    str(o.metrics[metric].n_samples)
                    for o in outcomes
                    if o and metric in o.metrics and o.metrics[metric].n_samples is not None
                ),
                "",
            )
            rows.append([label if i == 0 else "", metric, *values, n])
    return header, rows, footnotes


def _status_cell(outcome: TaskOutcome | None) -> str:
    return "—" if outcome is None else outcome.status


def _status_text(outcomes: Sequence[TaskOutcome | None]) -> str:
    return ", ".join(sorted({o.status for o in outcomes if o})) or "—"


def render_text(results: Sequence[InvocationResults]) -> str:
    """The table as plain aligned text (golden-tested; what `--plain` and logs show)."""
    header, rows, footnotes = table_rows(results)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip(),
        "-+-".join("-" * w for w in widths),
    ]
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines + footnotes) + "\n"


def print_table(results: Sequence[InvocationResults]) -> None:
    """Print the score table with rich."""
    from rich.console import Console
    from rich.table import Table

    header, rows, footnotes = table_rows(results)
    title = "scores" if len(results) > 1 else f"scores — invocation {results[0].invocation}"
    table = Table(title=title, title_justify="left", header_style="bold")
    for i, col in enumerate(header):
        table.add_column(col, justify="right" if 1 < i < len(header) else "left", no_wrap=True)
    for row in rows:
        styled = [_style(c) for c in row]
        table.add_row(*styled)
    console = Console()
    console.print(table)
    for note in footnotes:
        console.print(f"[dim]{note}[/]")


def _style(cell: str) -> str:
    from rich.markup import escape

    if cell.startswith("failed") or cell == "cancelled":
        return f"[red]{escape(cell)}[/]"
    return escape(cell)
