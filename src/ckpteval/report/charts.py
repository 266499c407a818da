"""Bar charts of a task's scores: one group of bars per metric, one bar per invocation, with 95 % error bars.

`bar_chart` gives the data of a chart (what the SVG and the PNG both draw), `render_svg` an inline SVG
(no script, no font or file to fetch), `write_png` the same chart as a PNG through matplotlib.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ckpteval.results.model import InvocationResults

Z_95 = 1.959963984540054
# Okabe-Ito: distinguishable with colour-vision deficiencies
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")


@dataclass(frozen=True)
class Bar:
    series: str  # the invocation (its label, or id)
    value: float
    low: float | None  # 95 % interval: value -/+ 1.96 stderr
    high: float | None


@dataclass(frozen=True)
class BarChart:
    task: str
    groups: list[tuple[str, list[Bar]]]  # metric -> one bar per invocation (missing ones left out)
    series: list[str]


def series_name(results: InvocationResults) -> str:
    return f"{results.label} ({results.invocation})" if results.label else results.invocation


def bar_chart(task: str, results: Sequence[InvocationResults]) -> BarChart | None:
    """The chart of one task across invocations; None when no invocation has a score for it."""
    series = [series_name(r) for r in results]
    groups: list[tuple[str, list[Bar]]] = []
    metrics: list[str] = []
    for r in results:
        outcome = r.tasks.get(task)
        if outcome and outcome.status == "succeeded":
            metrics.extend(m for m in outcome.metrics if m not in metrics)
    for metric in metrics:
        bars = []
        for name, r in zip(series, results, strict=True):
            outcome = r.tasks.get(task)
            m = outcome.metrics.get(metric) if outcome and outcome.status == "succeeded" else None
            if m is None:
                continue
            half = Z_95 * m.stderr if m.stderr is not None else None
            bars.append(
                Bar(
                    name,
                    m.value,
                    m.value - half if half is not None else None,
                    m.value + half if half is not None else None,
                )
            )
        groups.append((metric, bars))
    return BarChart(task, groups, series) if groups else None


def _svg_open(width: int, height: int, *, label: str, title: str, left: int) -> list[str]:
    """An inline SVG's opening tag and its title line."""
    esc = html.escape
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" aria-label="{esc(label)}">',
        f'<text x="{left}" y="16" class="chart-title">{esc(title)}</text>',
    ]


def _grid(
    y: Callable[[float], float], y_min: float, y_max: float, *, steps: int, x0: int, x1: int, fmt: str
) -> list[str]:
    """Horizontal grid lines with their value ticks, `steps` intervals from y_min to y_max."""
    out = []
    for i in range(steps + 1):
        v = y_min + (y_max - y_min) * i / steps
        out.append(f'<line x1="{x0}" x2="{x1}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>')
        out.append(f'<text x="{x0 - 6}" y="{y(v) + 4:.1f}" text-anchor="end" class="tick">{v:{fmt}}</text>')
    return out


def _top(chart: BarChart) -> float:
    highest = max((b.high if b.high is not None else b.value) for _, bars in chart.groups for b in bars)
    return 1.0 if highest <= 1.0 else highest * 1.1


def render_svg(chart: BarChart, *, width: int = 640, height: int = 300) -> str:
    """The chart as an inline SVG element."""
    left, right, top, bottom = 48, 12, 28, 56
    plot_w, plot_h = width - left - right, height - top - bottom
    y_max = _top(chart)
    lowest = min((b.low if b.low is not None else b.value) for _, bars in chart.groups for b in bars)
    y_min = min(0.0, lowest)

    def y(v: float) -> float:
        return top + plot_h * (1 - (v - y_min) / (y_max - y_min or 1.0))

    esc = html.escape
    out = _svg_open(width, height, label=f"{chart.task} scores", title=chart.task, left=left)
    out += _grid(y, y_min, y_max, steps=5, x0=left, x1=width - right, fmt=".2f")
    group_w = plot_w / len(chart.groups)
    n_series = len(chart.series)
    bar_w = min(48.0, group_w * 0.8 / n_series)
    for g, (metric, bars) in enumerate(chart.groups):
        x0 = left + g * group_w + (group_w - bar_w * n_series) / 2
        for bar in bars:
            s = chart.series.index(bar.series)
            x = x0 + s * bar_w
            color = PALETTE[s % len(PALETTE)]
            y_top, y_zero = y(max(bar.value, 0.0)), y(min(bar.value, 0.0))
            out.append(
                f'<rect x="{x + 2:.1f}" y="{y_top:.1f}" width="{bar_w - 4:.1f}" height="{max(y_zero - y_top, 0.5):.1f}"'
                f' fill="{color}"><title>{esc(bar.series)}: {esc(metric)} = {bar.value:.4f}</title></rect>'
            )
            if bar.low is not None and bar.high is not None:
                cx = x + bar_w / 2
                out.append(
                    f'<path d="M{cx:.1f},{y(bar.low):.1f}V{y(bar.high):.1f}M{cx - 5:.1f},{y(bar.low):.1f}'
                    f'h10M{cx - 5:.1f},{y(bar.high):.1f}h10" class="errorbar"/>'
                )
            label_y = y(max(bar.value, bar.high if bar.high is not None else bar.value)) - 4
            out.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{label_y:.1f}" text-anchor="middle" class="value">'
                f"{bar.value:.3f}</text>"
            )
        label_x = left + g * group_w + group_w / 2
        out.append(
            f'<text x="{label_x:.1f}" y="{top + plot_h + 18}" text-anchor="middle" class="metric">{esc(metric)}</text>'
        )
    for s, name in enumerate(chart.series):
        lx = left + s * (plot_w / max(n_series, 1))
        out.append(f'<rect x="{lx:.1f}" y="{height - 16}" width="10" height="10" fill="{PALETTE[s % len(PALETTE)]}"/>')
        out.append(f'<text x="{lx + 14:.1f}" y="{height - 7}" class="legend">{esc(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def write_png(chart: BarChart, path: Path, *, dpi: int = 150) -> Path:
    """The chart as a PNG (matplotlib, imported here: the CLI stays fast without it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_series = len(chart.series)
    width = 0.8 / n_series
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(chart.groups) + 2), 3.2), dpi=dpi)
    try:
        for s, name in enumerate(chart.series):
            xs: list[float] = []
            values: list[float] = []
            errs: list[list[float]] = [[], []]
            for g, (_, bars) in enumerate(chart.groups):
                bar = next((b for b in bars if b.series == name), None)
                if bar is None:
                    continue
                xs.append(g - 0.4 + width * (s + 0.5))
                values.append(bar.value)
                errs[0].append(bar.value - bar.low if bar.low is not None else 0.0)
                errs[1].append(bar.high - bar.value if bar.high is not None else 0.0)
            ax.bar(xs, values, width * 0.9, yerr=errs, capsize=3, label=name, color=PALETTE[s % len(PALETTE)])
        ax.set_xticks(range(len(chart.groups)), [m for m, _ in chart.groups])
        ax.set_ylim(min(0.0, ax.get_ylim()[0]), _top(chart))
        ax.set_title(chart.task)
        ax.set_ylabel("score (95 % CI)")
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path


@dataclass(frozen=True)
class Curve:
    """One score of a watched training run against iteration: (iteration, value, stderr or None) points."""

    run: str
    key: str  # <task>/<metric>
    points: tuple[tuple[int, float, float | None], ...]


def watch_curves(run: str, rows: Sequence[dict], keys: Sequence[str]) -> list[Curve]:
    """The curves of a watch run from its table rows (`ckpteval.watch.curves.curve_rows`): evaluated
    iterations only, in iteration order."""
    curves = []
    for key in keys:
        points = tuple(
            (int(row["iteration"]), float(row["scores"][key][0]), row["scores"][key][1])
            for row in rows
            if row["state"] == "succeeded" and key in row["scores"]
        )
        if points:
            curves.append(Curve(run=run, key=key, points=points))
    return curves


def render_curve_svg(curve: Curve, *, width: int = 640, height: int = 260) -> str:
    """A curve as an inline SVG: the score at each iteration, a band of ± 1 stderr where every point has one."""
    left, right, top, bottom = 56, 16, 28, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [p[0] for p in curve.points]
    lows = [v - (s or 0.0) for _, v, s in curve.points]
    highs = [v + (s or 0.0) for _, v, s in curve.points]
    y_min, y_max = min(lows), max(highs)
    pad = (y_max - y_min) * 0.1 or 0.05
    y_min, y_max = y_min - pad, y_max + pad
    x_min, x_max = min(xs), max(xs)

    def x(i: int) -> float:
        return left + (plot_w * (i - x_min) / (x_max - x_min) if x_max > x_min else plot_w / 2)

    def y(v: float) -> float:
        return top + plot_h * (1 - (v - y_min) / (y_max - y_min))

    esc = html.escape
    title = f"{curve.key} — watch run {curve.run}"
    out = _svg_open(width, height, label=f"{curve.key} against iteration", title=title, left=left)
    out += _grid(y, y_min, y_max, steps=4, x0=left, x1=width - right, fmt=".3f")
    if all(s is not None for _, _, s in curve.points) and len(curve.points) > 1:
        band = [f"{x(i):.1f},{y(h):.1f}" for (i, _, _), h in zip(curve.points, highs, strict=True)]
        band += [f"{x(i):.1f},{y(lo):.1f}" for (i, _, _), lo in reversed(list(zip(curve.points, lows, strict=True)))]
        out.append(f'<polygon points="{" ".join(band)}" fill="{PALETTE[0]}" fill-opacity="0.18"/>')
    line = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v, _ in curve.points)
    out.append(f'<polyline points="{line}" fill="none" stroke="{PALETTE[0]}" stroke-width="2"/>')
    for i, v, s in curve.points:
        spread = f" ± {s:.4f}" if s is not None else ""
        out.append(
            f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.5" fill="{PALETTE[0]}">'
            f"<title>iteration {i}: {esc(curve.key)} = {v:.4f}{spread}</title></circle>"
        )
        out.append(f'<text x="{x(i):.1f}" y="{y(v) - 8:.1f}" text-anchor="middle" class="value">{v:.3f}</text>')
        out.append(f'<text x="{x(i):.1f}" y="{top + plot_h + 16}" text-anchor="middle" class="tick">{i}</text>')
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle" class="metric">iteration</text>'
    )
    out.append("</svg>")
    return "\n".join(out)
