"""What users bring from nel, lm-eval and inspect, answered the ckpteval way: a first word that is not a
command (a typo, `run`, `ls`, `kill`), and a flag the framework does not know (`--model`, `--foo`).

Each answer is a `ConfigError` (one line, exit 2) that names what to type instead; the flags that map
cleanly (`-o`, `--limit`, `--model`, `-t a,b`) are real options of the default action, not answered here.
"""

from __future__ import annotations

from collections.abc import Iterable

from ckpteval.errors import ConfigError, close_matches

# a word from another tool -> (what to type here, why); `ls` reads its second word
_OTHER_TOOLS_WORDS: dict[str, tuple[str, str]] = {
    "run": ("evaluate -c CONFIG [--run PROFILE]", "evaluating is the default action, there is no `run` word"),
    "eval": ("evaluate -c CONFIG [--run PROFILE]", "evaluating is the default action, there is no `eval` word"),
    "kill": ("evaluate cancel ID", "`cancel` stops an invocation"),
    "stop": ("evaluate cancel ID", "`cancel` stops an invocation"),
    "info": ("evaluate status ID", "`status` shows an invocation"),
    "ps": ("evaluate status", "`status` lists recent invocations"),
}
_LISTINGS = {"tasks": "evaluate tasks", "runs": "evaluate status", "invocations": "evaluate status"}

# a flag from another tool -> the ckpteval way of saying it
_OTHER_TOOLS_FLAGS: dict[str, str] = {
    "--model_args": "pass deployment.* overrides, e.g. deployment.tensor_model_parallel_size=2",
    "--model-args": "pass deployment.* overrides, e.g. deployment.tensor_model_parallel_size=2",
    "--output_path": "results go to execution.output_dir: pass execution.output_dir=DIR",
    "--output-path": "results go to execution.output_dir: pass execution.output_dir=DIR",
    "--log-dir": "results go to execution.output_dir: pass execution.output_dir=DIR",
}


def is_bare_word(arg: str) -> bool:
    """A word that can be neither an option nor a Hydra override (those have `=`, or start `~`/`+`/`-`)."""
    return bool(arg) and "=" not in arg and arg[0] not in "-+~"


def unknown_first_word(args: list[str], commands: Iterable[str]) -> ConfigError:
    """The answer to `evaluate WORD ...` when WORD is no command: the command it resembles, or the
    ckpteval way of doing what another tool's word does."""
    word = args[0]
    if word == "ls":
        what = args[1] if len(args) > 1 else "runs"
        instead = _LISTINGS.get(what, "evaluate tasks` or `evaluate status")
        return ConfigError(f"Unknown command 'ls': use `{instead}`.", hint="`evaluate --help` lists the commands.")
    if word in _OTHER_TOOLS_WORDS:
        instead, why = _OTHER_TOOLS_WORDS[word]
        return ConfigError(f"Unknown command {word!r}: {why}; use `{instead}`.")
    matches = close_matches(word, commands, n=1)
    if matches:
        return ConfigError(
            f"Unknown command {word!r}. Did you mean `evaluate {matches[0]}`?",
            hint="`evaluate --help` lists the commands.",
        )
    return ConfigError(
        f"{word!r} is neither a command nor an override (overrides look like key=value).",
        hint="`evaluate --help` lists the commands and options.",
    )


def unknown_option(option: str, message: str, command: str | None) -> ConfigError:
    """The answer to a flag the command does not have: another tool's way mapped onto ckpteval's, or
    the framework's own message (with its "did you mean") and where the options are listed."""
    name = option.partition("=")[0]
    if command is None and name in _OTHER_TOOLS_FLAGS:
        return ConfigError(f"No option {name}: {_OTHER_TOOLS_FLAGS[name]}.")
    where = f"evaluate {command} --help" if command else "evaluate --help"
    return ConfigError(message.rstrip(".") + ".", hint=f"`{where}` lists the options.")
