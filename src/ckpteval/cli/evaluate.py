"""The default action: `evaluate -c CONFIG [--run|--batch PROFILE] [-d] [-t TASK] [OVERRIDES]`."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from pathlib import Path
from typing import Annotated

import typer

from ckpteval.cli import completion


def evaluate_command(
    config: Annotated[
        list[str] | None,
        typer.Option(
            "-c",
            "--config",
            metavar="NAME|PATH",
            autocompletion=completion.configs,
            help="A stage config (sft, tiny, ...) or a YAML path; repeat to compose left to right.",
        ),
    ] = None,
    run: Annotated[
        str | None,
        typer.Option(
            "-r",
            "--run",
            metavar="PROFILE",
            autocompletion=completion.profiles,
            help="Run attached on this env.toml profile: submit, follow, print the scores.",
        ),
    ] = None,
    batch: Annotated[
        str | None,
        typer.Option(
            "-b",
            "--batch",
            metavar="PROFILE",
            autocompletion=completion.profiles,
            help="Run detached on this env.toml profile: submit, print the invocation id, exit.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("-d", "--dry-run", help="Show the compiled config, job script and squash plan; do nothing.")
    ] = False,
    task: Annotated[
        list[str] | None,
        typer.Option(
            "-t",
            "--task",
            "--tasks",
            metavar="TASK[,TASK]",
            autocompletion=completion.tasks,
            help="Evaluate only these tasks (repeatable, or a,b).",
        ),
    ] = None,
    limit: Annotated[
        str | None,
        typer.Option(
            "--limit",
            metavar="N|FRACTION|none",
            help="Documents per task (per subtask: MMLU's --limit 5 is 5 per subject, 285 in all), a fraction "
            "of each task's documents (0.1), or none for all: the config's limit_samples, as lm-eval's --limit.",
        ),
    ] = None,
    num_fewshot: Annotated[
        int | None,
        typer.Option(
            "--num-fewshot",
            metavar="N",
            min=0,
            help="Few-shot examples per document, as lm-eval's --num_fewshot (its tasks' params.extra.num_fewshot).",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", metavar="PATH|ARTIFACT", help="The checkpoint to evaluate (run.model)."),
    ] = None,
    override: Annotated[
        list[str] | None,
        typer.Option("-o", "--override", metavar="KEY=VALUE", help="An override, as nel writes it (repeatable)."),
    ] = None,
    show_config: Annotated[
        bool,
        typer.Option(
            "-v", "--show-config", help="Before running, show the compiled config and job script (as --dry-run does)."
        ),
    ] = False,
    force_squash: Annotated[
        bool, typer.Option("--force-squash", help="Re-import container images even if their .sqsh exists.")
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="With --dry-run on a cluster: ask it, read-only, which images are squashed already."
        ),
    ] = False,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the results (results.json's content) on stdout; the rest, the table too, on stderr."
        ),
    ] = False,
    env_file: Annotated[Path | None, typer.Option("--env-file", help="The env.toml to read profiles from.")] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[OVERRIDES]...", help="Hydra overrides: a.b=1, +a.c=2, ~a.d, deployment=vllm.", show_default=False
        ),
    ] = None,
) -> None:
    """Evaluate a Megatron checkpoint on benchmarks, on this machine or on a Slurm cluster.

    [bold]Examples[/]

      evaluate -c tiny                            [dim]# this machine, CPU, offline[/]
      evaluate -c sft --run MY-CLUSTER            [dim]# submit, follow, print the scores[/]
      evaluate -c sft --batch MY-CLUSTER          [dim]# submit, print the invocation id[/]
      evaluate -c sft --run MY-CLUSTER --dry-run  [dim]# show everything, do nothing[/]
      evaluate -c sft -t adlr_mmlu,hellaswag --limit 10 deployment=vllm
      evaluate -c tiny --limit none               [dim]# every document[/]
      evaluate -c sft -t adlr_mmlu --num-fewshot 0  [dim]# zero-shot (few-shot: N)[/]
    """
    import time

    from ckpteval import CompileRequest
    from ckpteval import run as run_invocation
    from ckpteval.cli.console import ConsoleReporter, render_outcome
    from ckpteval.cli.habits import root_flag_word
    from ckpteval.errors import ConfigError

    if run and batch:
        raise ConfigError(
            "--run and --batch are mutually exclusive.",
            hint="--run PROFILE follows the job until it ends; --batch PROFILE submits and returns.",
        )
    limit_value = parse_limit(limit) if limit is not None else None
    empty = [value for value in task or () if not value.replace(",", "").strip()]
    if empty:  # `-t "$TASKS"` with an empty variable must not mean "every task of the config"
        raise ConfigError(
            f"-t {empty[0]!r} names no task.",
            hint="Name one (-t adlr_mmlu), or leave -t out to run the config's tasks.",
        )
    for word in overrides or ():
        refused = root_flag_word(word)
        if refused is not None:
            raise refused
    request = CompileRequest(
        configs=tuple(config or ()),
        profile=run or batch,
        mode="run" if run else "batch" if batch else "local",
        overrides=shortcut_overrides(limit=limit_value, model=model, num_fewshot=num_fewshot)
        + tuple(override or ())
        + tuple(overrides or ()),
        tasks=tuple(name.strip() for value in task or () for name in value.split(",") if name.strip()),
        env_file=env_file,
    )
    if json_output and (dry_run or batch):
        raise ConfigError(
            f"--json goes with a run that ends with results, not with {'--dry-run' if dry_run else '--batch'}.",
            hint="`evaluate results ID --json` prints a finished invocation's results.",
        )
    if check and not dry_run:
        raise ConfigError("--check goes with --dry-run.", hint="A real run checks the cluster's images anyway.")
    started = time.monotonic()
    with ConsoleReporter(show_config=show_config, json_output=json_output) as reporter:
        outcome = run_invocation(
            request, reporter=reporter, dry_run=dry_run, force_squash=force_squash, check_squash=check
        )
    render_outcome(outcome, reporter.console, elapsed=time.monotonic() - started)
    if json_output and outcome.results is not None:
        import json

        print(json.dumps(outcome.results.to_json(), indent=2), flush=True)
    if outcome.exit_status:
        raise typer.Exit(outcome.exit_status)


LIMIT_WORDS = ("none", "all")


def parse_limit(text: str) -> str:
    """`--limit`'s value as the config's limit_samples: a positive whole number, a fraction in (0, 1) (as
    lm-eval reads it), or `null` for `none`/`all`; anything else is a ConfigError that says what it takes."""
    from ckpteval.errors import ConfigError

    word = text.strip().lower()
    if word in LIMIT_WORDS:
        return "null"
    try:
        number = float(word)
    except ValueError:
        number = -1.0
    if number >= 1 and number.is_integer():
        return str(int(number))
    if 0 < number < 1:
        return repr(number)
    raise ConfigError(
        f"--limit takes a number of documents per task (5), a fraction of each task's documents (0.1), "
        f"or none (all of them); not {text!r}.",
        hint="lm-eval applies a number per subtask: MMLU's --limit 5 is 5 documents per subject (285).",
    )


def shortcut_overrides(*, limit: str | None, model: str | None, num_fewshot: int | None = None) -> tuple[str, ...]:
    """The overrides that `--limit`, `--model` and `--num-fewshot` stand for (first, so an explicit override
    wins)."""
    from ckpteval.cli.habits import FEWSHOT_KEY

    out = []
    if limit is not None:
        out.append(f"evaluation.nemo_evaluator_config.config.params.limit_samples={limit}")
    if num_fewshot is not None:  # `++`: set whether or not the config has the key
        out.append(f"++{FEWSHOT_KEY}={num_fewshot}")
    if model is not None:
        out.append(f"run.model={_quoted(model)}")
    return tuple(out)


def _quoted(value: str) -> str:
    # a path with Hydra's special characters (',', '=', spaces, brackets) is one string value
    return "'" + value.replace("'", "\\'") + "'"
