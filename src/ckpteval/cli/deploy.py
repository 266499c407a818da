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

    for field in _SWITCHED_OFF:  # `--no-x` given: the option `x` is off
        options[field] = not options.pop(f"no_{field}")
    ckpteval.serve(ServeOptions(**options))


def _parameter(flag: Any) -> inspect.Parameter:
    """A typer option for one of the server's flags; a switch that is on by default is offered as its `--no-x`
    alone (the `--x/--no-x` pair's second name takes a help column of its own at 80 columns)."""
    kind, name, help_text, default = flag.kind, flag.name, flag.help, flag.default
    field = flag.field
    if kind is bool and default is True:
        name, field, default = f"--no-{name[2:]}", f"no_{field}", False
        help_text = f"Switch off (on by default): {help_text[0].lower()}{help_text[1:]}"
    annotation = Annotated[kind | None if default is None else kind, typer.Option(name, help=help_text)]  # type: ignore[valid-type]  # built at run time
    default = inspect.Parameter.empty if flag.required else default
    return inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


_SWITCHED_OFF = [flag.field for flag in ServeOptions.flags() if flag.cli and flag.kind is bool and flag.default is True]
_PARAMETERS = [_parameter(flag) for flag in ServeOptions.flags() if flag.cli]
deploy_command.__signature__ = inspect.Signature(_PARAMETERS)  # type: ignore[attr-defined]
deploy_command.__annotations__ = {p.name: p.annotation for p in _PARAMETERS}
