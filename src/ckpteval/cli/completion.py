"""Shell completion (`evaluate --install-completion`): profile names for --run/--batch, task names for -t,
config names for -c, invocation ids for the commands that take one. A completer never fails: a broken
env.toml or catalog completes nothing rather than printing into the user's prompt."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from typing import Any

from ckpteval.errors import CkptevalError


def profiles(ctx: Any, incomplete: str) -> list[str]:
    """The env.toml profiles (of the file --env-file names, when it comes first)."""
    from ckpteval.views import profile_names

    try:
        return [n for n in profile_names(ctx.params.get("env_file")) if n.startswith(incomplete)]
    except (CkptevalError, OSError):
        return []


def configs(ctx: Any, incomplete: str) -> list[str]:
    """The config names -c accepts (a path is completed by the shell's own file completion)."""
    from ckpteval.views import config_names

    try:
        return [n for n in config_names(ctx.params.get("env_file")) if n.startswith(incomplete)]
    except (CkptevalError, OSError):
        return []


def tasks(incomplete: str) -> list[str]:
    """Task names of the catalog; after a comma (`-t a,b`), the next name."""
    from ckpteval.views import task_names

    done, _, word = incomplete.rpartition(",")
    prefix = f"{done}," if done else ""
    try:
        return [prefix + n for n in task_names() if n.startswith(word)]
    except (CkptevalError, OSError):
        return []


def invocations(incomplete: str) -> list[str]:
    """Recorded invocation ids, newest first."""
    from ckpteval.views import invocation_ids

    try:
        return [i for i in invocation_ids() if i.startswith(incomplete)]
    except (CkptevalError, OSError):
        return []
