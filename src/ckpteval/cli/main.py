"""The `evaluate` command: a default action (evaluate a checkpoint) beside named subcommands.

`evaluate -c sft --run X a.b=1` runs the default action; `evaluate status X` runs a subcommand.
Only the first word decides: a registered command name selects that command, anything else is
handed to the default action, so a Hydra override is never mistaken for a command and a command's
arguments are never mistaken for overrides.

Commands are imported lazily (by name) so `evaluate --help` loads no command's dependencies.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import importlib
from typing import Any, NoReturn

import typer
import typer.core
import typer.main

# Typer 0.29 carries its own copy of Click: its usage errors are these classes, not the `click` package's
from typer._click.exceptions import NoSuchOption, UsageError

from ckpteval.errors import CkptevalError

DEFAULT_COMMAND = "run"

# name -> (module under ckpteval.cli, function, one-line help shown in `evaluate --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "inspect": (
        "inspect",
        "inspect_command",
        "Describe a checkpoint and which backends can serve it (reads no weights; --run PROFILE: on its cluster).",
    ),
    "tasks": ("tasks", "tasks_command", "List the task catalog: harness, endpoint type, log-probs, offline data."),
    "status": ("status", "status_command", "State of an invocation and its tasks, or of recent invocations."),
    "logs": ("logs", "logs_command", "An invocation's log (job, deployment or a task); -f follows."),
    "cancel": ("cancel", "cancel_command", "Stop a running invocation; finished tasks keep their results."),
    "resume": ("resume", "resume_command", "Run a stopped invocation again; finished tasks are skipped."),
    "results": ("results", "results_command", "Scores of invocations, side by side; --json for machines."),
    "compare": (
        "compare",
        "compare_command",
        "Is B better than A? Paired tests per task, CIs, Holm; --fail-on-regression gates CI.",
    ),
    "samples": (
        "samples",
        "samples_command",
        "Each document's prompt, answer, target and score; --vs OTHER: the flips between two invocations.",
    ),
    "report": ("report", "report_command", "One self-contained HTML report: scores, CIs, charts, verdicts."),
    "export": ("export", "export_command", "Export an invocation's results to W&B or MLflow (again), or Inspect logs."),
    "watch": ("watch", "watch_command", "Evaluate each new checkpoint of a running training; watch status|stop RUN."),
    "data": ("data", "data_command", "Tasks' datasets: fetch where the hub is reachable, push to an offline cluster."),
    "squash": ("squash", "squash_command", "Squash Docker images to cached .sqsh files on a Slurm cluster."),
    "prepare": ("prepare", "prepare_command", "Write a packaged model (smollm2, tiny) as a Megatron checkpoint."),
    "deploy": ("deploy", "deploy_command", "Serve a Megatron checkpoint behind an OpenAI-compatible API."),
    "export-hf": (
        "export_hf",
        "export_hf_command",
        "Write a Megatron checkpoint as a Hugging Face directory (vLLM, SGLang), checked against it.",
    ),
    "serve-delegate": (
        "serve_delegate",
        "serve_delegate_command",
        "Serve POST /evaluate for RL training loops (slime's eval delegate protocol).",
    ),
}


class EvaluateGroup(typer.core.TyperGroup):
    """A group whose first word is either a subcommand or the start of the default action's arguments."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)  # the default action has no word of its own (completion offers these)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name == DEFAULT_COMMAND:
            from ckpteval.cli import evaluate

            return _typer_command(evaluate.evaluate_command, DEFAULT_COMMAND)
        if cmd_name not in COMMANDS:
            return None
        module_name, func_name, _ = COMMANDS[cmd_name]
        module = importlib.import_module(f"ckpteval.cli.{module_name}")
        func = getattr(module, func_name)
        if isinstance(func, typer.Typer):  # a command with its own subcommands
            return typer.main.get_group(func)
        return _typer_command(func, cmd_name)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        from ckpteval.cli.habits import is_bare_word, unknown_first_word

        if args and args[0] == "help":  # `evaluate help [COMMAND]`, as git and nel read it
            args = [args[1], "--help"] if len(args) > 1 and args[1] in COMMANDS else ["--help"]
        if args and args[0] not in COMMANDS and is_bare_word(args[0]) and not ctx.resilient_parsing:
            raise unknown_first_word(args, COMMANDS)
        own = {name for param in self.get_params(ctx) for name in param.opts}  # --help, --version, completion
        if args and args[0] not in COMMANDS and args[0].partition("=")[0] not in own:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)

    def make_context(self, info_name: Any, args: list[str], parent: Any = None, **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except (CkptevalError, UsageError) as exc:
            _exit_with(exc)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, cmd, rest = super().resolve_command(ctx, args)
        # usage lines of the default action read "evaluate [OPTIONS]", not "evaluate run [OPTIONS]"
        return (None if name == DEFAULT_COMMAND else name), cmd, rest

    def invoke(self, ctx: Any) -> Any:
        from ckpteval.notices import show_notices

        show_notices()  # the library's notices (a W&B login found, a converter's progress) as lines on stderr
        try:
            return super().invoke(ctx)
        except (CkptevalError, UsageError) as exc:  # a subcommand's usage mistake lands here
            _exit_with(exc)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from ckpteval.cli.help import render_root_help

        render_root_help(ctx, COMMANDS)


def _exit_with(exc: CkptevalError | UsageError) -> NoReturn:
    """Report a mistake as one line (plus its hint) and exit: the framework's usage errors too, so an
    unknown flag reads like every other mistake instead of a boxed usage message."""
    if isinstance(exc, UsageError):
        exc = _as_config_error(exc)
    report_error(exc)
    raise typer.Exit(exc.exit_code) from None


def _as_config_error(exc: UsageError) -> CkptevalError:
    from ckpteval.cli.habits import unknown_option
    from ckpteval.errors import ConfigError

    # the words of the command the mistake is in: `evaluate`, `evaluate status`, `evaluate watch stop`
    path = exc.ctx.command_path.split() if exc.ctx is not None else []
    command = " ".join(w for w in path[1:] if w != DEFAULT_COMMAND) or None
    if isinstance(exc, NoSuchOption):
        return unknown_option(exc.option_name, exc.format_message(), command)
    where = f"evaluate {command} --help" if command else "evaluate --help"
    return ConfigError(exc.format_message().rstrip(".") + ".", hint=f"`{where}` shows the usage.")


def _typer_command(func: Any, name: str) -> Any:
    sub = typer.Typer(add_completion=False, rich_markup_mode="rich")
    settings = getattr(func, "context_settings", None) or {}
    sub.command(name=name, context_settings=settings)(func)
    return typer.main.get_command(sub)


def _version(value: bool) -> None:
    if value:
        from ckpteval import __version__

        typer.echo(f"ckpteval {__version__}")
        raise typer.Exit()


app = typer.Typer(
    cls=EvaluateGroup,
    name="evaluate",
    add_completion=True,  # --install-completion / --show-completion; the completers: ckpteval.cli.completion
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """Benchmark scores for a trained Megatron checkpoint."""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (errors become one line and an exit code in `EvaluateGroup.invoke`)."""
    app(args=argv, prog_name="evaluate")


def report_error(exc: CkptevalError) -> None:
    """Print an error as one red line plus its hint, on stderr, without a traceback."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(f"[bold red]error:[/] {escape(exc.message)}")
    if exc.hint:
        console.print(f"[dim]{escape(exc.hint)}[/]")
