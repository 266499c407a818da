"""env.toml: where evaluations run (profiles) and where results go ([wandb]).

```toml
[wandb]
entity = "my-team"
project = "evals"

[MY-CLUSTER]
executor = "slurm"
host = "login.example.com"
account = "llm"
remote_job_dir = "/lustre/me/ckpteval"

[MY-CLUSTER-DEBUG]
extends = "MY-CLUSTER"
partition = "interactive"

[judges.llama-70b]            # a judge set once, named with judge=llama-70b
type = "api"
url = "https://judge.example.com/v1"
model_id = "meta/llama-3.1-70b-instruct"
api_key_name = "JUDGE_API_KEY"   # the NAME of a variable holding its key, never the key
```

A profile's `judge = "llama-70b"` makes that judge its judge-scored tasks' judge unless `judge=...` names
another.

The file is found by `--env-file`, then `$CKPTEVAL_ENV_FILE`, then by walking up from the working
directory, then in the user config dir. Without `--run`/`--batch` the built-in `local` profile is used
and no env.toml is needed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from ckpteval.config.paths import is_dir, is_file
from ckpteval.config.profile_types import NEUTRAL_KEYS, ExecutorProfile, Profile
from ckpteval.config.typed import from_mapping
from ckpteval.errors import ConfigError, did_you_mean
from ckpteval.merge import deep_merge

ENV_FILE_NAME = "env.toml"
ENV_FILE_VAR = "CKPTEVAL_ENV_FILE"
LOCAL_PROFILE = "local"
RESERVED_SECTIONS = ("wandb", "cli", "judges")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def make_profile(name: str, executor: str | None = None, *, where: str | None = None, **keys: Any) -> Profile:
    """A profile from env.toml keys (flat, as a profile table spells them), typed and validated as env.toml's
    are: an unknown key is refused with its close names, a key of another executor with that executor. Without
    `executor`, the one a profile that names none gets (`DEFAULT_EXECUTOR`)."""
    from ckpteval.config.executors import DEFAULT_EXECUTOR, EXECUTORS, find_executor

    executor = executor or DEFAULT_EXECUTOR
    where = where or f"profile [{name}]"
    found = find_executor(executor, where=where)
    part_keys = {k: v for k, v in keys.items() if k not in NEUTRAL_KEYS}
    own = {f.name for f in dataclasses.fields(found.profile) if f.init}
    for key in part_keys:
        if key in own:
            continue
        valid = sorted({*own, *NEUTRAL_KEYS})
        others = [e.name for e in EXECUTORS.entries() if key in {f.name for f in dataclasses.fields(e.profile)}]
        if others:
            raise ConfigError(
                f"{where}: '{key}' is a key of {' and '.join(repr(o) for o in others)} profiles, and this profile's "
                f"executor is {executor!r}.",
                hint=f"Remove it, or set executor = {others[0]!r}. Keys of a profile with executor = {executor!r}: "
                + ", ".join(valid)
                + ".",
            )
        raise ConfigError(
            f"{where}: unknown key '{key}'.{did_you_mean(key, valid)}",
            hint="Valid keys here: " + ", ".join(valid) + ".",
        )
    neutral = from_mapping(
        _NeutralKeys, {k: v for k, v in keys.items() if k in NEUTRAL_KEYS and k != "executor"}, where=where
    )
    part = from_mapping(found.profile, part_keys, where=where)
    profile = Profile(name=name, executor=executor, extends=neutral.extends, judge=neutral.judge, part=part)
    _check_numbers(part, where=where)
    return profile


def saved_profile(saved: dict[str, Any], *, executor: str) -> Profile:
    """A profile as a record saved it (`Profile.to_config()`, flat), read back with the keys its executor still
    has (a record written by an older version may hold keys that are now another executor's)."""
    from ckpteval.config.executors import find_executor

    own = {f.name for f in dataclasses.fields(find_executor(executor).profile) if f.init}
    keys = {k: v for k, v in saved.items() if k in own or k in ("extends", "judge")}
    return make_profile(str(saved.get("name", "saved")), executor, where="the invocation's saved profile", **keys)


@dataclass(frozen=True, kw_only=True)
class _NeutralKeys:
    extends: str | None = None
    judge: str | None = None


@dataclass(frozen=True)
class WandbSettings:
    """The `[wandb]` section: defaults for `export.wandb`."""

    entity: str | None = None
    project: str | None = None


@dataclass(frozen=True)
class EnvFile:
    """A parsed env.toml (or none: `path` is None and only the built-in local profile exists)."""

    path: Path | None
    raw_profiles: dict[str, dict[str, Any]]
    wandb: WandbSettings
    config_dirs: tuple[Path, ...] = ()
    # [judges.NAME]: judge sections (as `judge:` in a config), each validated as it is read
    judges: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def profile_names(self) -> list[str]:
        """The profiles a user can name, the built-in `local` included."""
        return sorted(set(self.raw_profiles) | {LOCAL_PROFILE})

    def profile(self, name: str | None) -> Profile:
        """The named profile with `extends` applied; None means the built-in local profile."""
        if name is None or (name == LOCAL_PROFILE and LOCAL_PROFILE not in self.raw_profiles):
            return make_profile(LOCAL_PROFILE, "local")
        if name not in self.raw_profiles:
            where = str(self.path) if self.path else "no env.toml was found"
            raise ConfigError(
                f"Unknown profile '{name}' ({where}).{did_you_mean(name, self.profile_names)}",
                hint="Profiles that exist: "
                + ", ".join(self.profile_names)
                + "."
                + ("" if self.path else f" Create an {ENV_FILE_NAME} (see env.toml.example) or pass --env-file."),
            )
        merged = self._merged(name, chain=())
        merged.pop("extends", None)
        where = f"{self.path} [{name}]"
        executor = merged.pop("executor", None)
        if executor is not None and not isinstance(executor, str):
            raise ConfigError(f"{where}: 'executor' must be a string, not {executor!r}.")
        profile = make_profile(name, executor, where=where, **merged)
        if profile.judge is not None and profile.judge not in (*self.judges, *packaged_judges()):
            named = sorted(self.judges)
            raise ConfigError(
                f"{self.path} [{name}]: judge = {profile.judge!r} names no [judges.{profile.judge}] table."
                + did_you_mean(profile.judge, named),
                hint=("Judges set in this file: " + ", ".join(named) + ".")
                if named
                else f'Add one: [judges.{profile.judge}] with type = "api", url, model_id (see env.toml.example).',
            )
        return profile

    def _merged(self, name: str, chain: tuple[str, ...]) -> dict[str, Any]:
        if name in chain:
            cycle = " -> ".join((*chain, name))
            raise ConfigError(
                f"{self.path}: profiles extend each other in a cycle: {cycle}.",
                hint="Remove one of the `extends` keys.",
            )
        if name not in self.raw_profiles:
            child = chain[-1]
            raise ConfigError(
                f"{self.path}: profile [{child}] extends '{name}', which does not exist."
                + did_you_mean(name, self.raw_profiles),
                hint="Profiles that exist: " + ", ".join(sorted(self.raw_profiles)) + ".",
            )
        own = dict(self.raw_profiles[name])
        parent = own.get("extends")
        if parent is None:
            return own
        if not isinstance(parent, str):
            raise ConfigError(f"{self.path}: [{name}] extends must be a profile name, not {parent!r}.")
        # dict-valued keys (env_vars, sbatch_flags) merge key by key; everything else is replaced.
        return deep_merge(self._merged(parent, chain=(*chain, name)), own)


def user_config_dir() -> Path:
    """The per-user config directory (`$XDG_CONFIG_HOME/ckpteval`)."""
    root = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(root) / "ckpteval"


# Numbers a profile may hold but nothing can use (a port past 65535, zero nodes): key -> (low, high)
NUMBER_RANGES: dict[str, tuple[int, int | None]] = {
    "port": (1, 65535),
    "nodes": (1, None),
    "gpus_per_node": (0, None),
    "watch_signal_lead": (10, None),
}


def _check_numbers(part: ExecutorProfile, *, where: str) -> None:
    """Refuse the numbers of NUMBER_RANGES outside their range, whichever executor's keys they are."""
    for key, (low, high) in NUMBER_RANGES.items():
        value = getattr(part, key, None)
        if value is not None and (value < low or (high is not None and value > high)):
            allowed = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ConfigError(f"{where}: '{key}' must be {allowed}, not {value}.", hint=f"Fix {key} in that profile.")


def find_env_file(explicit: Path | None = None, *, cwd: Path | None = None) -> Path | None:
    """The env.toml to use: --env-file, $CKPTEVAL_ENV_FILE, walking up from cwd, the user config dir."""
    if explicit is not None:
        if is_dir(explicit):
            raise ConfigError(
                f"--env-file {explicit} is a directory.", hint=f"Pass the file: --env-file {explicit}/env.toml"
            )
        if not is_file(explicit):
            raise ConfigError(f"--env-file {explicit}: no such file.")
        return explicit
    from_env = os.environ.get(ENV_FILE_VAR)
    if from_env:
        path = Path(from_env).expanduser()
        if not is_file(path):
            raise ConfigError(
                f"${ENV_FILE_VAR} is {from_env!r}, which is not a file.", hint=f"Fix or unset {ENV_FILE_VAR}."
            )
        return path
    here = (cwd or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / ENV_FILE_NAME
        if candidate.is_file():
            return candidate
    candidate = user_config_dir() / ENV_FILE_NAME
    return candidate if candidate.is_file() else None


def load_env_file(explicit: Path | None = None, *, cwd: Path | None = None) -> EnvFile:
    """Find and parse env.toml; a missing file is fine (only the local profile exists then)."""
    path = find_env_file(explicit, cwd=cwd)
    if path is None:
        return EnvFile(path=None, raw_profiles={}, wandb=WandbSettings())
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}.", hint="Fix the line it names.") from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"{path} is not a text file (it is not UTF-8), so it cannot be an env.toml.",
            hint="Point --env-file at your env.toml (see env.toml.example).",
        ) from None
    except OSError as exc:
        raise ConfigError(f"Cannot read {path}: {exc.strerror}.") from None

    wandb_raw = data.get("wandb", {})
    wandb = from_mapping(WandbSettings, wandb_raw, where=f"{path} [wandb]", path="wandb")
    cli_raw = data.get("cli", {})
    if not isinstance(cli_raw, dict) or set(cli_raw) - {"config_dirs"}:
        raise ConfigError(f"{path} [cli]: only `config_dirs` is allowed there.")
    dirs = cli_raw.get("config_dirs", [])
    if not isinstance(dirs, list) or not all(isinstance(d, str) and d for d in dirs):
        raise ConfigError(
            f"{path} [cli]: config_dirs must be a list of directory paths, not {dirs!r}.",
            hint='Write config_dirs = ["~/my-configs"].',
        )
    config_dirs = tuple((path.parent / Path(d).expanduser()).resolve() for d in dirs)

    judges = _judges(data.get("judges", {}), where=str(path))
    profiles: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key in RESERVED_SECTIONS:
            continue
        if not isinstance(value, dict):
            raise ConfigError(
                f"{path}: top-level key '{key}' is not a [profile] table.",
                hint="Put settings inside a profile, e.g. [MY-CLUSTER], or in [wandb].",
            )
        profiles[key] = value
    return EnvFile(path=path, raw_profiles=profiles, wandb=wandb, config_dirs=config_dirs, judges=judges)


def packaged_judges() -> set[str]:
    """The names `judge=` takes without env.toml (the packaged `conf/judge` options, the registered types): a
    named judge cannot take one."""
    from ckpteval.config.schema import JUDGE_TYPES

    group = Path(__file__).resolve().parent.parent / "conf" / "judge"
    return {p.stem for p in group.glob("*.yaml")} | set(JUDGE_TYPES)


def _judges(raw: Any, *, where: str) -> dict[str, dict[str, Any]]:
    """The [judges.NAME] tables, each typed as a `judge:` section (its dotted path and the close key in any
    message), its key given as the NAME of a variable, its name not one of the packaged judges'."""
    from ckpteval.config.schema import JUDGE_TYPES
    from ckpteval.config.typed import Registered, typed_value

    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: [judges] must hold tables, one per judge: [judges.NAME].")
    out: dict[str, dict[str, Any]] = {}
    for name, table in raw.items():
        dotted = f"judges.{name}"
        if not isinstance(table, dict):
            raise ConfigError(
                f"{where}: '{dotted}' must be a table ([{dotted}] with type, url, model_id).",
                hint="See env.toml.example.",
            )
        if name in packaged_judges():
            raise ConfigError(
                f"{where}: [{dotted}] takes the name of the packaged judge={name}.",
                hint=f"Name it otherwise, e.g. [judges.my-{name}].",
            )
        typed_value(Annotated[Any, Registered(JUDGE_TYPES, by="type")], table, where=where, path=dotted)
        key = table.get("api_key_name")
        if isinstance(key, str) and not _VARIABLE_NAME.fullmatch(key):
            # the value may be the key itself, pasted by mistake: it is not repeated here
            raise ConfigError(
                f"{where}: '{dotted}.api_key_name' must be the NAME of an environment variable that holds the "
                "judge's key (e.g. JUDGE_API_KEY), not the key.",
                hint="Export the key in that variable; env.toml never holds a secret.",
            )
        out[name] = dict(table)
    return out


def toml_value(value: Any) -> str:
    """`value` written as a TOML value (what an env.toml profile key holds)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"The profile value {value!r} cannot be written to an env.toml.")
