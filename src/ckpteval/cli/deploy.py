"""`evaluate deploy`: serve a Megatron checkpoint behind an OpenAI-compatible API on this machine.

Its options are the server's own, declared once with `ServeOptions` (those its flags offer to the CLI), so a new
server option needs no edit here.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import inspect
from typing import Annotated, Any

import typer

from ckpteval.types import ServeOptions


def deploy_command(**options: Any) -> None:
    """Serve a Megatron checkpoint with megatron-core: /v1/completions, /v1/chat/completions, /v1/models, /v1/health.

    Runs on one GPU, or on the CPU when there is none. Ctrl-C stops it.

      evaluate prepare smollm2 --output ckpts/smollm2
      evaluate deploy --checkpoint ckpts/smollm2 --port 8000
      curl localhost:8000/v1/completions -d '{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}'
    """
    import ckpteval

    ckpteval.serve(ServeOptions(**options))


def _parameter(flag: Any) -> inspect.Parameter:
    """A typer option for one of the server's flags (`--x/--no-x` for a switch that is on by default)."""
    kind = flag.kind | None if flag.default is None else flag.kind
    names = [f"{flag.name}/--no-{flag.name[2:]}"] if flag.kind is bool and flag.default is True else [flag.name]
    annotation = Annotated[kind, typer.Option(*names, help=flag.help)]  # type: ignore[valid-type]  # built at run time
    default = inspect.Parameter.empty if flag.required else flag.default
    return inspect.Parameter(flag.field, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


_PARAMETERS = [_parameter(flag) for flag in ServeOptions.flags() if flag.cli]
deploy_command.__signature__ = inspect.Signature(_PARAMETERS)  # type: ignore[attr-defined]
deploy_command.__annotations__ = {p.name: p.annotation for p in _PARAMETERS}
