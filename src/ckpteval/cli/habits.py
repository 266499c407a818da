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

FEWSHOT_KEY = "evaluation.nemo_evaluator_config.config.params.extra.num_fewshot"
_MODEL = "the checkpoint is --model PATH (run.model=PATH); how it is served: deployment.* overrides"
_OUTPUT = "results go to execution.output_dir: pass execution.output_dir=DIR"
_BATCH = (
    "the deployment batches requests itself (deployment.max_batch_size=8); requests in flight per task: "
    "evaluation.nemo_evaluator_config.config.params.parallelism=8"
)
_DEVICE = "the builtin server's device is deployment.device (auto, cpu or cuda): pass deployment.device=cuda"
_FEWSHOT = f"the few-shot count of lm-eval's tasks is --num-fewshot 5 (++{FEWSHOT_KEY}=5)"

# a flag from another tool (lm-eval, nel, inspect) -> the ckpteval way of saying it, both spellings
_OTHER_TOOLS_FLAGS: dict[str, str] = {
    spelling: answer
    for flag, answer in (
        ("--model_args", _MODEL),
        ("--pretrained", _MODEL),
        ("--output_path", _OUTPUT),
        ("--log_dir", _OUTPUT),
        ("--batch_size", _BATCH),
        ("--device", _DEVICE),
        ("--num_fewshot", _FEWSHOT),
    )
    for spelling in (flag, flag.replace("_", "-"))
    if spelling != "--num-fewshot"  # an option of the default action
}
# a word that is a flag of the root command, typed without its dashes
_ROOT_FLAGS = {"version": "--version"}


def is_bare_word(arg: str) -> bool:
    """A word that can be neither an option nor a Hydra override (those have `=`, or start `~`/`+`/`-`)."""
    return bool(arg) and "=" not in arg and arg[0] not in "-+~"


def unknown_first_word(args: list[str], commands: Iterable[str]) -> ConfigError:
    """The answer to `evaluate WORD ...` when WORD is no command: the command it resembles, or the
    ckpteval way of doing what another tool's word does."""
    word = args[0]
    if word in _ROOT_FLAGS:
        return ConfigError(f"Unknown command {word!r}. Did you mean `evaluate {_ROOT_FLAGS[word]}`?")
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


def root_flag_word(word: str) -> ConfigError | None:
    """`evaluate -c tiny version`: a root flag written as a word among the overrides."""
    if word in _ROOT_FLAGS:
        return ConfigError(f"{word!r} is not an override. Did you mean `evaluate {_ROOT_FLAGS[word]}`?")
    return None


def unknown_option(option: str, message: str, command: str | None) -> ConfigError:
    """The answer to a flag the command does not have: another tool's way mapped onto ckpteval's, or
    the framework's own message (with its "did you mean") and where the options are listed."""
    name = option.partition("=")[0]
    if name in _OTHER_TOOLS_FLAGS and command is None:
        return ConfigError(f"No option {name}: {_OTHER_TOOLS_FLAGS[name]}.")
    where = f"evaluate {command} --help" if command else "evaluate --help"
    return ConfigError(message.rstrip(".") + ".", hint=f"`{where}` lists the options.")
