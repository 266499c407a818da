"""`evaluate report`: one self-contained HTML page (inline CSS and SVG; nothing fetched when it opens) with
the invocations, the score table with standard errors and 95 % intervals, a bar chart per task, the
comparison verdicts of every invocation against the first, and each watched training run's scores against
iteration."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import html
from collections.abc import Sequence

from ckpteval.report.charts import Z_95, Curve, bar_chart, render_curve_svg, render_svg, series_name
from ckpteval.results.answers import TaskFlips, shorten
from ckpteval.results.compare import BETTER, WORSE, Comparison
from ckpteval.results.model import InvocationResults

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; margin: 2rem auto;
       max-width: 1280px; color: #1b1b1b; padding: 0 1rem; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
.table-box { max-width: 100%; overflow-x: auto; }
table { border-collapse: collapse; margin: 0.5rem 0; font-size: 0.9rem; }
th, td { padding: 0.25rem 0.5rem; border-bottom: 1px solid #eee; text-align: left; overflow-wrap: anywhere; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.better { color: #007a3d; font-weight: 600; } .worse { color: #c0002a; font-weight: 600; }
.note { color: #555; font-size: 0.85rem; }
.warning { color: #8a5a00; background: #fff8e1; padding: 0.2rem 0.4rem; margin: 0.2rem 0; }
table.flips td { vertical-align: top; } table.flips td.answer { width: 30%; }
table.flips pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; font-size: 0.8rem; max-height: 16rem;
                  overflow-y: auto; }
details summary { cursor: pointer; } details pre { background: #f6f6f6; padding: 0.3rem; }
.charts { display: flex; flex-wrap: wrap; gap: 1rem; }
svg .grid { stroke: #e5e5e5; } svg .tick, svg .value, svg .legend, svg .metric { font-size: 11px; fill: #333; }
svg .chart-title { font-size: 13px; font-weight: 600; } svg .errorbar { stroke: #222; stroke-width: 1.2; fill: none; }
"""


def _box(table: str) -> str:
    """A table in its own box: a table wider than the page scrolls inside it, never the page itself."""
    return f'<div class="table-box">{table}</div>'


def _e(text: object) -> str:
    return html.escape(str(text))


def _f(value: float | None, fmt: str = ".4f") -> str:
    return "—" if value is None else format(value, fmt)


def _p(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2g}" if value < 0.001 else f"{value:.3f}"


def render_report(
    results: Sequence[InvocationResults],
    comparison: Comparison | None = None,
    *,
    generated: str = "",
    curves: Sequence[Curve] = (),
    verdicts: Sequence[dict] = (),
    flips: Sequence[TaskFlips] = (),
) -> str:
    """The whole page (`curves`: the score-vs-iteration curves of watched training runs, if any; `verdicts`:
    their checkpoints' paired comparisons, `ckpteval.watch.verdicts` rows with `run`, `iteration`, `vs`;
    `flips`: the documents whose score changed between the baseline and each candidate, per task)."""
    title = ", ".join([*(r.invocation for r in results), *dict.fromkeys(f"watch {c.run}" for c in curves)])
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>ckpteval report: {_e(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>ckpteval report</h1>",
        f'<p class="note">generated {_e(generated)}</p>' if generated else "",
    ]
    if results:
        parts += [_invocations(results), "<h2>Scores</h2>", _scores(results), "<h2>Charts</h2>", '<div class="charts">']
        tasks = list(dict.fromkeys(t for r in results for t in r.tasks))
        for task in tasks:
            chart = bar_chart(task, results)
            if chart is not None:
                parts.append(f'<figure id="chart-{_e(task)}">{render_svg(chart)}</figure>')
        parts.append("</div>")
    if comparison is not None:
        parts += ["<h2>Comparison</h2>", _comparison(comparison)]
    if flips:
        parts += ["<h2>Per-sample changes</h2>", _flips(flips)]
    if curves:
        parts += [
            "<h2>Scores against iteration</h2>",
            '<p class="note">Each evaluated checkpoint of a watched training run (evaluate watch); '
            "the band is ± 1 standard error.</p>",
            '<div class="charts">',
            *(f'<figure id="curve-{_e(c.run)}-{_e(c.key)}">{render_curve_svg(c)}</figure>' for c in curves),
            "</div>",
        ]
    if verdicts:
        parts += ["<h2>Is each checkpoint better?</h2>", _verdicts(verdicts)]
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p) + "\n"


def _verdicts(rows: Sequence[dict]) -> str:
    numeric = ("iteration", "against", "delta", "MDE")
    names = ("run", "iteration", "vs", "task", "metric", "against", "delta", "95 % CI", "MDE", "verdict")
    head = "".join(f'<th class="num">{n}</th>' if n in numeric else f"<th>{n}</th>" for n in names)
    body = []
    for r in rows:
        verdict = r["verdict"] if r["tested"] else "not tested: " + (r["note"] or "no per-sample scores")
        ci = f"[{_f(r['ci_low'], '+.4f')}, {_f(r['ci_high'], '+.4f')}]"
        body.append(
            f'<tr><td>{_e(r["run"])}</td><td class="num">{r["iteration"]}</td><td>{_e(r["vs"])}</td>'
            f'<td>{_e(r["task"])}</td><td>{_e(r["metric"])}</td><td class="num">{r["against"]}</td>'
            f'<td class="num">{_f(r["delta"], "+.4f")}</td><td>{ci}</td><td class="num">{_f(r["mde"])}</td>'
            f"<td>{_e(verdict)}</td></tr>"
        )
    return (
        '<p class="note">Each evaluated checkpoint against the previous one and the best earlier one on that '
        "metric: paired test on the documents both scored (evaluate compare; docs/compare.md).</p>"
        f'<table id="watch-verdicts"><tr>{head}</tr>{"".join(body)}</table>'
    )


def _invocations(results: Sequence[InvocationResults]) -> str:
    from ckpteval.results.provenance import provenance_summary

    def produced_by(r: InvocationResults) -> str:
        return "<br>".join(f"{_e(k)}: {_e(v)}" for k, v in provenance_summary(r.provenance).items())

    rows = "".join(
        f"<tr><td>{_e(r.invocation)}</td><td>{_e(r.label or '')}</td><td>{_e(r.model or '')}</td>"
        f'<td>{_e(r.created)}</td><td>{_e(r.status)}</td><td class="provenance">{produced_by(r)}</td></tr>'
        for r in results
    )
    return _box(
        '<table id="invocations"><tr><th>invocation</th><th>label</th><th>model</th><th>created</th>'
        f"<th>status</th><th>produced by</th></tr>{rows}</table>"
    )


def _scores(results: Sequence[InvocationResults]) -> str:
    from ckpteval.results.table import OFFLINE_MARK, table_rows

    head = "".join(f'<th class="num" colspan="4">{_e(series_name(r))}</th>' for r in results)
    sub = "".join(
        '<th class="num">score</th><th class="num">± stderr</th><th class="num">95 % CI</th><th class="num">n</th>'
        for _ in results
    )
    body = []
    tasks = list(dict.fromkeys(t for r in results for t in r.tasks))
    for task in tasks:
        outcomes = [r.tasks.get(task) for r in results]
        metrics = list(dict.fromkeys(m for o in outcomes if o for m in o.metrics))
        if not metrics:
            states = ", ".join(sorted({o.status for o in outcomes if o}))
            body.append(f"<tr><td>{_e(task)}</td><td>{_e(states)}</td></tr>")
            continue
        for i, metric in enumerate(metrics):
            cells = []
            for o in outcomes:
                m = o.metrics.get(metric) if o and o.status == "succeeded" else None
                if m is None:
                    cells.append(f'<td class="num" colspan="4">{_e(o.status if o else "—")}</td>')
                    continue
                ci = "—"
                if m.stderr is not None:
                    ci = f"[{m.value - Z_95 * m.stderr:.4f}, {m.value + Z_95 * m.stderr:.4f}]"
                n = "" if m.n_samples is None else m.n_samples
                cells.append(
                    f'<td class="num">{m.value:.4f}</td><td class="num">{_f(m.stderr)}</td><td class="num">{ci}</td>'
                    f'<td class="num">{n}</td>'
                )
            offline = any(o and o.data and o.data.offline for o in outcomes)
            label = f"{task} {OFFLINE_MARK}" if offline else task
            body.append(f"<tr><td>{_e(label) if i == 0 else ''}</td><td>{_e(metric)}</td>{''.join(cells)}</tr>")
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in table_rows(results)[2])
    return (
        _box(
            f'<table id="scores"><tr><th>task</th><th>metric</th>{head}</tr>'
            f"<tr><th></th><th></th>{sub}</tr>{''.join(body)}</table>"
        )
        + '<p class="note">95 % CI: score ± 1.96 × stderr (the harness\'s stderr, or the standard error of the '
        "per-sample scores where it gave none).</p>" + notes
    )


def _comparison(comparison: Comparison) -> str:
    rows = []
    for r in comparison.rows:
        css = {BETTER: "better", WORSE: "worse"}.get(r.verdict, "")
        ci = f"[{r.ci_low:+.4f}, {r.ci_high:+.4f}]" if r.ci_low is not None and r.ci_high is not None else "—"
        diff = "—" if r.difference is None else f"{r.difference:+.4f}"
        rows.append(
            f"<tr><td>{_e(r.candidate)}</td><td>{_e(r.task)}</td><td>{_e(r.metric)}</td>"
            f'<td class="num">{_f(r.baseline_value)}</td><td class="num">{_f(r.candidate_value)}</td>'
            f'<td class="num">{diff}</td><td class="num">{ci}</td><td>{_e(r.test or "—")}</td>'
            f'<td class="num">{_p(r.p_value)}</td><td class="num">{_p(r.p_adjusted)}</td>'
            f'<td class="num">{_f(r.mde)}</td><td class="num">{r.n}{"*" if r.note else ""}</td>'
            f'<td class="{css}">{_e(r.verdict)}</td></tr>'
        )
    notes = "".join(
        f"<li>{_e(r.candidate)} {_e(r.task)} {_e(r.metric)}: {_e(r.note)}</li>" for r in comparison.rows if r.note
    )
    # the same lines, word for word, as `evaluate compare` prints (Comparison.warning_lines)
    warnings = "".join(f'<li class="warning">{_e(line)}</li>' for line in comparison.warning_lines())
    return (
        f"<p>Baseline: <b>{_e(comparison.baseline)}</b>.</p>"
        + (f'<ul id="comparison-warnings">{warnings}</ul>' if warnings else "")
        + _box(
            '<table id="comparison"><tr><th>candidate</th><th>task</th><th>metric</th><th class="num">baseline</th>'
            '<th class="num">candidate</th><th class="num">Δ</th><th class="num">95 % CI</th><th>test</th>'
            '<th class="num">p</th><th class="num">Holm p</th><th class="num">MDE</th><th class="num">n</th>'
            f"<th>verdict</th></tr>{''.join(rows)}</table>"
        )
        + (f'<ul class="note">{notes}</ul>' if notes else "")
        + f'<p class="note">{_e(comparison.method())}</p>'
    )


FLIPS_SHOWN = 50  # per task and candidate: the worst ones


def _pre(text: str | None) -> str:
    return f"<pre>{_e(text)}</pre>" if text is not None else "—"


def _flips(all_flips: Sequence[TaskFlips]) -> str:
    parts = [
        '<p class="note">Each task\'s documents both invocations scored whose score changed, worst first '
        "(right → wrong, then wrong → right); a document is right when its score is above 0.5. Click a prompt "
        "to read it whole.</p>"
    ]
    for task in dict.fromkeys(f.task for f in all_flips):
        parts.append(f"<h3>{_e(task)}</h3>")
        for tf in (f for f in all_flips if f.task == task):
            parts.append(
                f"<p>{_e(tf.baseline)} → <b>{_e(tf.candidate)}</b> on {_e(tf.metric)}: "
                f'<span class="worse">{tf.lost} right → wrong</span>, '
                f'<span class="better">{tf.gained} wrong → right</span>, '
                f"{len(tf.flips)} changed of {tf.common} documents both scored.</p>"
            )
            if not tf.flips:
                continue
            rows = []
            for f in tf.flips[:FLIPS_SHOWN]:
                b, c = f.baseline, f.candidate
                css = "worse" if f.change < 0 else "better"
                prompt = (
                    f"<details><summary>{_e(shorten(b.prompt, 80, keep_end=True))}</summary>{_pre(b.prompt)}</details>"
                    if b.prompt
                    else "—"
                )
                rows.append(
                    f"<tr><td>{_e(b.sample)}</td><td>{prompt}</td>"
                    f'<td class="answer">{_pre(b.shown_answer)}</td><td class="answer">{_pre(c.shown_answer)}</td>'
                    f"<td>{_pre(b.target)}</td>"
                    f'<td class="num {css}">{b.score:g} → {c.score:g}</td></tr>'
                )
            more = len(tf.flips) - FLIPS_SHOWN
            table_id = f"flips-{tf.task}-{tf.candidate}"
            parts.append(
                _box(
                    f'<table class="flips" id="{_e(table_id)}"><tr><th>document</th><th>prompt</th>'
                    f"<th>{_e(tf.baseline)} answered</th><th>{_e(tf.candidate)} answered</th><th>target</th>"
                    f'<th class="num">score</th></tr>{"".join(rows)}</table>'
                )
                + (
                    f'<p class="note">… and {more} more (evaluate samples {_e(tf.baseline)} --vs '
                    f"{_e(tf.candidate)} -t {_e(tf.task)} --limit 0)</p>"
                    if more > 0
                    else ""
                )
            )
    return "\n".join(parts)
