"""The builtin server's options, declared once: `ServeOptions`, and for each field its flag and help.

Every place an option travels reads this one declaration: the job's deployment command
(`deploy.commands.builtin_command` → `ServeOptions.to_argv`), the entry point a job runs
(`python -m ckpteval.server serve`: `add_arguments` → `from_args`), the router's command for each replica
(`to_argv` of a copy) and `evaluate deploy` (its options are built from `ServeOptions.flags()`). A new option
is one field and one `Flag` here (and, where a config sets it, one line in `builtin_command`). Stdlib only.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.server.prepare import PACKAGED_MODELS

DEFAULT_MODEL_NAME = "megatron-model"
DEFAULT_MAX_BATCH_SIZE = 16
ENTRY_POINT = "ckpteval.server"  # `python -m ckpteval.server serve ...`


@dataclass(frozen=True)
class ServeOptions:
    """Everything `serve` needs (`prepare` and `publish_tokenizer` are done by the entry point first)."""

    checkpoint: Path
    iteration: str | None = None  # serve this iteration ("1000", "release") whatever the tracker names now
    port: int = 8000
    host: str = "127.0.0.1"
    served_model_name: str = DEFAULT_MODEL_NAME
    device: str = "auto"
    dtype: str = "auto"
    max_batch_size: int | None = None
    max_batch_tokens: int | None = None
    prepare: str | None = None  # a packaged model to prepare into `checkpoint` first if it is not there
    replicas: int = 1  # > 1: that many server processes behind one router (see `server.router`)
    tokenizer: str | None = None  # a Hugging Face tokenizer dir or hub id; None: the checkpoint's
    ignore_unexpected_tensors: bool = False  # serve a checkpoint holding tensors its args' model lacks
    publish_tokenizer: Path | None = None  # first write the tokenizer served with here, for the task clients
    prefix_cache: bool = True  # score each shared token prefix once (see `server.prefix_cache`)
    prefix_cache_mib: int | None = None  # None: sized to the machine (`prefix_cache.default_budget_mib`)
    access_log: bool = False
    identity: str | None = None  # the job's token for this deployment, reported by /v1/health and /v1/models
    port_file: Path | None = None  # write the port held here as soon as it is held
    port_fallback: bool = False  # a taken --port: take one the kernel assigns instead of failing
    report_file: Path | None = None  # write what was loaded here (`server.loaded`) once it serves
    load_secret_file: Path | None = None  # accept loads in place (`server.inplace`) from who reads this secret
    load_into: Path | None = None  # start no server: load into the one whose load directory this is

    @staticmethod
    def flags() -> tuple[Flag, ...]:
        """The command-line flag of each field, in the order a command line lists them."""
        return FLAGS

    def to_argv(self, python: str = sys.executable) -> list[str]:
        """The command line that starts a server with these options (`python -m ckpteval.server serve ...`):
        each flag whose value differs from its default, and those marked `always`. Quote each element
        (shlex.quote) when rendering it into a shell script."""
        argv = [python, "-m", ENTRY_POINT, "serve"]
        for flag in FLAGS:
            argv += flag.encode(getattr(self, flag.field))
        return argv

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """Declare every option on `parser` (the entry point's `serve`)."""
        for flag in FLAGS:
            flag.add_to(parser)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeOptions:
        """The options an `add_arguments` parser parsed."""
        return cls(**{flag.field: getattr(args, flag.field) for flag in FLAGS})

    @classmethod
    def from_argv(cls, argv: list[str]) -> ServeOptions:
        """The options of a `serve` command line (the flags after `serve`); the inverse of `to_argv`."""
        parser = argparse.ArgumentParser(prog=f"python -m {ENTRY_POINT} serve")
        cls.add_arguments(parser)
        return cls.from_args(parser.parse_args(argv))


@dataclass(frozen=True)
class Flag:
    """One field's command-line flag: `--field-name`, its help, and where it is offered."""

    field: str
    help: str
    always: bool = False  # on every command line, even at its default (a job script then says it)
    cli: bool = True  # offered by `evaluate deploy` too (else only by the entry point a job runs)
    choices: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        return "--" + self.field.replace("_", "-")

    @property
    def kind(self) -> type:
        """The field's type without None (bool, int, str or Path)."""
        hint = _HINTS[self.field]
        return next(a for a in typing.get_args(hint) if a is not type(None)) if typing.get_args(hint) else hint

    @property
    def default(self) -> Any:
        """The field's default (dataclasses.MISSING for one that has none)."""
        return _FIELDS[self.field].default

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    def encode(self, value: Any) -> list[str]:
        """This flag on a command line, for `value`: nothing where it is the default (unless `always`)."""
        if value is None or (value == self.default and not self.always):
            return []
        if self.kind is bool:
            return [self.name if value else "--no-" + self.name[2:]]
        return [self.name, str(value)]

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Declare this flag on an argparse parser; `--x/--no-x` for a switch that defaults to on."""
        if self.kind is bool:
            action = argparse.BooleanOptionalAction if self.default else "store_true"
            parser.add_argument(self.name, dest=self.field, action=action, default=self.default, help=self.help)
            return
        parser.add_argument(
            self.name,
            dest=self.field,
            type=self.kind,
            required=self.required,
            default=None if self.required else self.default,
            choices=self.choices,
            help=self.help,
        )


FLAGS: tuple[Flag, ...] = (
    Flag(
        "checkpoint",
        "The checkpoint root (the iteration its tracker file names) or an iter_* directory.",
        always=True,
    ),
    Flag(
        "iteration",
        "Serve this iteration of the checkpoint root (a number or 'release') whatever its tracker names now; "
        "an error if it no longer exists. Default: the one the tracker names.",
    ),
    Flag("port", "TCP port to listen on.", always=True),
    Flag("host", "Address to listen on (0.0.0.0 for every interface).", always=True),
    Flag("served_model_name", "The model name clients must send (or omit).", always=True),
    Flag("device", "auto (a GPU when there is one), cpu, cuda or cuda:N.", always=True),
    Flag("dtype", "auto (float32 on CPU, the training dtype on GPU), float32, bfloat16, float16."),
    Flag("max_batch_size", f"Most requests run in one forward pass (default {DEFAULT_MAX_BATCH_SIZE})."),
    Flag("max_batch_tokens", "Most padded tokens in one scoring forward (default 32768)."),
    Flag(
        "prepare",
        "Prepare this packaged model into --checkpoint first if it is missing.",
        cli=False,
        choices=PACKAGED_MODELS,
    ),
    Flag("replicas", "Server processes behind this port; each request goes to the least busy."),
    Flag(
        "tokenizer", "A Hugging Face tokenizer directory or hub id. Default: the checkpoint's own (evaluate inspect)."
    ),
    Flag(
        "ignore_unexpected_tensors",
        "Serve a checkpoint that holds tensors the model its args build does not have (they are not loaded).",
    ),
    Flag(
        "publish_tokenizer",
        "First write the tokenizer served with, as a Hugging Face directory, here (the task clients read it).",
        cli=False,
    ),
    Flag("prefix_cache", "Compute each shared token prefix once (scoring requests)."),
    Flag(
        "prefix_cache_mib",
        "Memory the prefix cache may hold, in MiB. Default: an eighth of the memory available, 256 to 4096.",
    ),
    Flag("access_log", "Log every request."),
    Flag("identity", "A token naming this deployment, reported by /v1/health and /v1/models.", cli=False),
    Flag("port_file", "Write the port held here as soon as it is held.", cli=False),
    Flag(
        "port_fallback",
        "If --port is taken, serve on a port the kernel assigns (with --port-file, to tell the clients).",
        cli=False,
    ),
    Flag("report_file", "Write what was loaded (path, iteration, content identity, args) here as JSON.", cli=False),
    Flag(
        "load_secret_file",
        "Accept POST /v1/load (load another checkpoint of the same model in place) from whoever can read the "
        "secret written here (mode 0600).",
        cli=False,
    ),
    Flag(
        "load_into",
        "Start no server: load --checkpoint in place into the running one whose load directory this is (its "
        "port and load secret), stand for it until stopped.",
        cli=False,
    ),
)
_FIELDS = {f.name: f for f in dataclasses.fields(ServeOptions)}
_HINTS = typing.get_type_hints(ServeOptions)
