"""`evaluate inspect PATH`: what a checkpoint is and which backends can serve it, before anything runs."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import json
from pathlib import Path
from typing import Annotated

import typer


def inspect_command(
    path: Annotated[
        str, typer.Argument(help="A checkpoint: Megatron root or iter_* directory, or a Hugging Face directory.")
    ],
    run: Annotated[
        str | None, typer.Option("--run", help="The checkpoint is on this profile's cluster: read it over SSH.")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option("--tokenizer", help="What deployment.tokenizer would say (an HF dir or hub id).")
    ] = None,
    origin: Annotated[
        str | None,
        typer.Option("--origin", help="What deployment.origin would say: the HF model it came from (dir or hub id)."),
    ] = None,
    env_file: Annotated[Path | None, typer.Option("--env-file", help="The env.toml with the profile.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Describe a checkpoint (layout, model, the numbers of its forward pass, defaults included, saved
    parallelism, size, tokenizer), compare it with the Hugging Face model it came from where one is named, and
    say, per backend, whether it can serve it and the memory that takes. Reads no weights."""
    from ckpteval import inspect_checkpoint

    description = inspect_checkpoint(path, profile=run, tokenizer=tokenizer, origin=origin, env_file=env_file)
    if json_output:
        print(json.dumps(description.to_json(), indent=2, default=str))
        return
    from rich.console import Console
    from rich.markup import escape

    from ckpteval.cli.preview import flowed_lines
    from ckpteval.views import checkpoint_summary

    console = Console(highlight=False, soft_wrap=True)
    for line in flowed_lines(checkpoint_summary(description), console.width):  # wrapped under its label
        console.print(escape(line))
