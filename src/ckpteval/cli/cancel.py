"""`evaluate cancel INVOCATION`: stop a running invocation (its deployment stops with it)."""

from __future__ import annotations

from typing import Annotated

import typer


def cancel_command(invocation: Annotated[str, typer.Argument(help="An invocation id (or prefix).")]) -> None:
    """Cancel a running invocation; finished tasks keep their results."""
    from ckpteval.api import cancel

    print(cancel(invocation))
