"""`evaluate cancel INVOCATION`: stop a running invocation (its deployment stops with it)."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from typing import Annotated

import typer

from ckpteval.cli import completion


def cancel_command(
    invocation: Annotated[
        str, typer.Argument(autocompletion=completion.invocations, help="An invocation id (or prefix).")
    ],
) -> None:
    """Cancel a running invocation; finished tasks keep their results."""
    from ckpteval import cancel

    print(cancel(invocation))
