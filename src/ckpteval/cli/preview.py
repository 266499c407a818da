"""Draw the preview (`ckpteval.types.PreviewPanel`s) with rich: summary, compiled config, extra panels;
or, before a real run, only its compact header (what runs, where, where the results go)."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ckpteval.types import CompiledConfig, PreviewPanel
from ckpteval.views import config_yaml


def render_preview(
    compiled: CompiledConfig,
    *,
    invocation: str | None = None,
    panels: Sequence[PreviewPanel] = (),
    dry_run: bool = False,
) -> None:
    """Print the preview: summary, compiled config, extra panels."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    console = Console(soft_wrap=False)
    redact = compiled.secrets.redact
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold", no_wrap=True)
    summary.add_column(overflow="fold")  # a long override folds onto the next line, never cut
    mode = {"local": "this machine (attached)", "run": "attached", "batch": "detached"}[compiled.mode]
    summary.add_row("mode", mode + (" — dry run, nothing will be done" if dry_run else ""))
    summary.add_row("profile", f"{compiled.profile.name} ({compiled.profile.executor})")
    if compiled.env_file:
        summary.add_row("env.toml", str(compiled.env_file))
    if invocation:
        summary.add_row("invocation", invocation + (" (this dry run's; the run gets its own)" if dry_run else ""))
    sources = ["default", *(str(p) for p in compiled.config_files)]
    summary.add_row("configs", " < ".join(sources))
    if compiled.request.overrides:
        room = console.width - 4 - len("invocation") - 2  # inside the panel's border, after the labels
        summary.add_row("overrides", "\n".join(_override_lines(redact(o), room) for o in compiled.request.overrides))
    summary.add_row("tasks", tasks_with_documents(compiled))
    if judge := deployed_judge_row(compiled):
        summary.add_row("judge", judge)
    for note in compiled.notes:
        summary.add_row("note", note)
    console.print(Panel(summary, title="[bold green]evaluate[/]", border_style="green", expand=False))
    # the config, like the scripts below, as plain lines under a rule: copyable, no border inside
    console.rule("[bold green]compiled config[/]", align="left", style="green")
    console.print(config_yaml(compiled), markup=False, highlight=False, soft_wrap=True, crop=False)
    for panel in panels:
        if panel.full_only_in_dry_run and not dry_run:
            console.print(f"[bold green]{panel.title}[/] [dim](shown in full by --dry-run)[/]")
            continue
        if panel.squash is not None:
            from ckpteval.cli.squash_view import squash_plan_panel

            console.print(squash_plan_panel(panel.squash))
            continue
        # scripts are printed as they are, lines whole (the terminal wraps them, no border inside), so they
        # can be copied; descriptions are wrapped at the terminal's width under their labels
        console.rule(f"[bold green]{panel.title}[/]", align="left", style="green")
        body = redact(panel.body)
        if panel.language == "text":
            body = "\n".join(flowed_lines(body, console.width))
        console.print(body, markup=False, highlight=False, soft_wrap=True, crop=False)
    if panels:
        console.rule(style="green")


def tasks_with_documents(compiled: CompiledConfig) -> str:
    """The tasks, each with the documents it will evaluate where ckpteval knows the count (`--limit` applies
    per subtask: MMLU's 5 is 285 documents), one per line when any count is known."""
    from ckpteval.views import planned_documents

    counts = planned_documents(compiled)
    if not counts:
        return ", ".join(t.name for t in compiled.tasks)
    return "\n".join(t.name + (f": {counts[t.name]}" if t.name in counts else "") for t in compiled.tasks)


def _override_lines(override: str, room: int) -> str:
    """One override per line; one longer than the room breaks before its `=` (its value whole on the next
    line), and only a key longer than the room folds."""
    key, eq, value = override.partition("=")
    if len(override) <= room or not eq:
        return override
    return f"{key}\n  ={value}"


def flowed_lines(text: str, width: int) -> list[str]:
    """`text` wrapped at `width` without cutting a word: a `label   value` line goes on under its value's
    column, an indented line under its indent + 2, a paragraph from the margin. A word longer than the room
    (a path) stays whole on its own line, so it copies whole."""
    import re
    import textwrap

    lines = text.splitlines()
    # the column the values start at (the longest label is followed by one space only)
    starts = [len(m.group(1)) for m in (re.match(r"^(\S+ {2,})\S", ln) for ln in lines) if m]
    column = max(set(starts), key=starts.count) if starts else 0
    out: list[str] = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        lead = len(line) - len(line.lstrip(" "))
        labelled = column and not lead and len(line) > column and line[column - 1] == " "
        indent = column if labelled else (lead + 2 if lead else 0)
        if indent > width // 2:
            indent = 4
        out.extend(
            textwrap.wrap(
                line,
                width=width,
                subsequent_indent=" " * indent,
                break_long_words=False,
                break_on_hyphens=False,
                drop_whitespace=True,
            )
            or [line]
        )
    return out


def render_header(compiled: CompiledConfig, invocation: str, console: Any) -> None:
    """The few lines before a real run's progress: the invocation, the model and how it is served, the
    tasks, the profile, where the results go (the compiled config is in --dry-run and -v)."""
    from rich.markup import escape

    rows = header_rows(compiled, invocation)
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        # soft-wrapped: a path longer than the terminal is left whole for the terminal to wrap, so it copies whole
        shown = escape(compiled.secrets.redact(value)).replace("\n", "\n" + " " * (width + 2))  # under the value
        line = f"[bold]{label:<{width}}[/]  {shown}"
        console.print(line, soft_wrap=True, highlight=False)
    console.print("[dim]the compiled config and job script: --show-config (or --dry-run)[/]")


def deployed_judge_row(compiled: CompiledConfig) -> str | None:
    """A judge deployed beside the model, and where (None: none is): its served name, checkpoint, backend,
    and on Slurm the node(s) of its own it runs on, after the model's."""
    data = compiled.data
    judge = data.get("judge") or {}
    if judge.get("type") not in ("megatron", "vllm"):
        return None
    where = "a second server"
    if compiled.config.execution.on_cluster:
        first = int((data.get("deployment") or {}).get("num_nodes") or 1) + 1
        last = first + int(judge.get("num_nodes") or 1) - 1
        where += (f" on node {first}" if first == last else f" on nodes {first}-{last}") + " of the allocation"
    served = f"{judge.get('served_model_name')}: {judge.get('hf_model_handle') or judge.get('checkpoint_path')}"
    if judge.get("type") == "vllm":
        return f"{served} (vLLM, {where})"
    return f"{served} (megatron, {judge.get('backend')} backend, {where})"


def header_rows(compiled: CompiledConfig, invocation: str) -> list[tuple[str, str]]:
    """(label, value) rows of the run header, in words."""
    data = compiled.data
    deployment = data.get("deployment") or {}
    served = str(deployment.get("type"))
    if served == "none":
        served = f"an endpoint that runs already: {(data.get('target') or {}).get('api_endpoint', {}).get('url')}"
    else:
        backend, device = deployment.get("backend"), deployment.get("device")
        served += f", {backend} backend" if backend else ""
        served += f" on {device}" if device and device != "auto" else ""
    model = (data.get("run") or {}).get("model") or deployment.get("checkpoint_path") or "(none)"
    mode = {"local": "attached", "run": "attached", "batch": "detached"}[compiled.mode]
    output_dir = str((data.get("execution") or {}).get("output_dir", "")).rstrip("/")
    if not compiled.config.execution.on_cluster:
        profile = f"{compiled.profile.name} (this machine, {mode})"
        results = f"{Path(output_dir).resolve() / invocation}/"
    else:
        profile = f"{compiled.profile.name} ({compiled.profile.executor}, {mode})"
        results = f"{output_dir}/{invocation}/ on the cluster"
    judged = [("judge", row)] if (row := deployed_judge_row(compiled)) else []
    return [
        ("invocation", invocation),
        ("model", str(model)),
        ("served by", served),
        *judged,
        ("tasks", tasks_with_documents(compiled)),
        ("profile", profile),
        ("results", results),
    ]
