"""`evaluate tasks`: the task catalog."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from typing import Annotated

import typer


def tasks_command(
    pattern: Annotated[str | None, typer.Argument(help="Only tasks whose name contains this text.")] = None,
    harness: Annotated[str | None, typer.Option("--harness", help="Only tasks of this harness.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the tasks `-t` accepts: name, harness, endpoint type, what it needs (log-probs; a judge model:
    set one with judge=...), offline data, whether it runs on this machine (its harness installed here), and
    what it is."""
    import ckpteval
    from ckpteval.cli.render import print_catalog
    from ckpteval.views import no_tasks_hint

    # the JSON has the datasets each task loads (about a second to read lm-eval's task YAML)
    found = ckpteval.tasks(pattern, harness=harness, datasets=json_output)
    hint = "" if found else no_tasks_hint(pattern, harness=harness)
    print_catalog(found, json_output=json_output, hint=hint)
