"""`evaluate compare A B [C ...]`: paired statistics of each candidate against a baseline, and a CI gate."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import json
from typing import TYPE_CHECKING, Annotated

import typer

from ckpteval.cli import completion
from ckpteval.errors import ConfigError

if TYPE_CHECKING:
    from ckpteval.types import Comparison, MetricComparison


def compare_command(
    invocations: Annotated[
        list[str],
        typer.Argument(
            autocompletion=completion.invocations, help="Invocation ids (or prefixes); the first is the baseline."
        ),
    ],
    baseline: Annotated[
        str | None, typer.Option("--baseline", "-b", help="The invocation the others are compared with.")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
    fail_on_regression: Annotated[
        bool,
        typer.Option(
            "--fail-on-regression",
            help="Exit 3 when a candidate is significantly worse than the baseline by more than --max-drop; "
            "exit 4 when the comparison has a caveat or warning (see --allow-caveats).",
        ),
    ] = False,
    allow_caveats: Annotated[
        bool,
        typer.Option(
            "--allow-caveats",
            help="Let --fail-on-regression pass despite caveats (no provenance, an ignored origin mismatch, an "
            "unverified endpoint, answers from several checkpoints) and differences besides the model (still printed).",
        ),
    ] = False,
    max_drop: Annotated[
        float, typer.Option("--max-drop", help="Allowed drop of a metric (its own scale: 0.01 = 1 point of 0-1).")
    ] = 0.0,
    alpha: Annotated[float, typer.Option("--alpha", help="Significance level (after Holm's correction).")] = 0.05,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap and permutation resampling.")] = 0,
    resamples: Annotated[int, typer.Option("--resamples", help="Bootstrap / permutation resamples.")] = 10_000,
) -> None:
    """Is B better than A? Per task and metric: the difference with its 95 % CI, a paired test on the
    documents both scored (exact McNemar for 0/1 scores, permutation otherwise), Holm-corrected p, the
    minimum detectable effect and a verdict. See docs/compare.md."""
    import ckpteval
    from ckpteval.views import REGRESSION_EXIT_CODE, UNTRUSTED_EXIT_CODE

    if max_drop < 0:
        raise ConfigError(f"--max-drop must not be negative, not {max_drop}.")
    result = ckpteval.compare(invocations, baseline=baseline, alpha=alpha, seed=seed, resamples=resamples)
    regressions = result.regressions(max_drop) if fail_on_regression else []
    untrusted = result.untrusted() if fail_on_regression and not allow_caveats else []
    if json_output:
        data = result.to_json()
        if fail_on_regression:
            data["max_drop"] = max_drop
            data["regressions"] = [f"{r.candidate}: {r.task} {r.metric}" for r in regressions]
            data["untrusted"] = untrusted
        print(json.dumps(data, indent=2))
    else:
        print_comparison(result)
    if regressions or untrusted:
        from rich.console import Console
        from rich.markup import escape

        console = Console(stderr=True, highlight=False, soft_wrap=True)
        for row in regressions:
            console.print(f"[bold red]regression:[/] {escape(_why(row, result.alpha, max_drop))}")
        if regressions:
            raise typer.Exit(REGRESSION_EXIT_CODE)
        console = Console(stderr=True, highlight=False)  # words, not numbers: wrapped at the terminal's width
        console.print(
            f"[bold red]not trusted:[/] {len(untrusted)} caveat(s) or warning(s) above: the gate cannot say the "
            "candidate is not worse. Fix them, or pass --allow-caveats to accept them."
        )
        raise typer.Exit(UNTRUSTED_EXIT_CODE)


def _why(row: MetricComparison, alpha: float, max_drop: float) -> str:
    return (
        f"{row.candidate} is worse than {row.baseline} on {row.task} {row.metric}: "
        f"{_num(row.baseline_value)} -> {_num(row.candidate_value)} ({_signed(row.difference)}, "
        f"CI [{_signed(row.ci_low)}, {_signed(row.ci_high)}], {row.test} p = {_p(row.p_value)}, "
        f"Holm p = {_p(row.p_adjusted)} < {alpha}; allowed drop {max_drop})"
    )


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.4f}"


def _signed(v: float | None) -> str:
    return "—" if v is None else f"{v:+.4f}"


def _p(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.2g}" if v < 0.001 else f"{v:.3f}"


_SHORT_TEST = {"exact McNemar": "McNemar", "paired permutation": "permutation"}


def comparison_rows(result: Comparison, candidate: str) -> list[list[str]]:
    """The table rows of one candidate (plain text cells)."""
    rows = []
    for r in result.rows:
        if r.candidate != candidate:
            continue
        ci = f" [{_signed(r.ci_low)}, {_signed(r.ci_high)}]" if r.ci_low is not None else ""
        n = str(r.n) if r.test else ""
        if r.test and (r.n != r.n_baseline or r.n != r.n_candidate):
            n += "*"
        test = _SHORT_TEST.get(r.test or "", "—")
        rows.append(
            [
                r.task,
                r.metric,
                _num(r.baseline_value),
                _num(r.candidate_value),
                _signed(r.difference) + ci,
                test,
                _p(r.p_value),
                _p(r.p_adjusted),
                _num(r.mde),
                n,
                r.verdict,
            ]
        )
    return rows


def _named(result: Comparison, invocation: str) -> str:
    label = result.labels.get(invocation)
    return f"{invocation} ({label})" if label else invocation


def print_comparison(result: Comparison) -> None:
    """One rich table per candidate, then the notes and how the numbers were made."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ckpteval.cli.fit import print_fitting

    console = Console()
    for line in result.warning_lines():
        word, _, rest = line.partition(": ")
        console.print(f"[bold yellow]{escape(word)}:[/] {escape(rest)}", highlight=False)
    header = [
        "task",
        "metric",
        "baseline",
        "candidate",
        f"Δ [{result.level:.0%} CI]",
        "test",
        "p",
        "Holm p",
        "MDE",
        "n",
        "verdict",
    ]
    style = {"better": "green", "worse": "bold red"}
    for candidate in result.candidates:
        title = f"{_named(result, candidate)} vs baseline {_named(result, result.baseline)}"
        table = Table(title=title, title_justify="left", header_style="bold")
        for i, col in enumerate(header):
            left = i < 2 or col in ("test", "verdict")
            table.add_column(col, justify="left" if left else "right", no_wrap=i > 1, overflow="fold")
        rows = []
        for cells in comparison_rows(result, candidate):
            verdict = cells[-1]
            cells[-1] = f"[{style[verdict]}]{verdict}[/]" if verdict in style else verdict
            rows.append([c if i == len(cells) - 1 else escape(c) for i, c in enumerate(cells)])
            table.add_row(*rows[-1])
        # stacked (a narrow terminal): the verdict beside the task and metric, the numbers below
        stacked = [[*r[:2], r[-1], *r[2:-1]] for r in rows]
        print_fitting(console, table, [*header[:2], header[-1], *header[2:-1]], stacked, name_columns=3)
        for r in result.rows:
            if r.candidate == candidate and r.note:
                console.print(f"[dim]{escape(r.task)} {escape(r.metric)}: {escape(r.note)}[/]")
    if any(r.test and (r.n != r.n_baseline or r.n != r.n_candidate) for r in result.rows):
        console.print("[dim]* compared only on the documents both invocations scored[/]")
    console.print(f"[dim]{escape(result.method())}[/]")
