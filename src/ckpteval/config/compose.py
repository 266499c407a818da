"""Compile one evaluation config: compose, apply the profile and overrides, filter tasks, resolve.

Precedence, lowest first — all of it decided in `composition_layers`, nowhere else:

0. the registered sections' own defaults (`export.<name>` of a destination `conf/default.yaml` does not
   declare; `deployment=<type>` for a registered type with no `conf/deployment/<type>.yaml`), so a
   registered one is set like a shipped one
1. packaged defaults (`conf/default.yaml` and the groups it selects)
2. stage configs, `-c` left to right (names from the user's config dirs or the packaged `conf/`, or paths)
3. the env.toml profile (`run.env`, `run.wandb`, the execution group it implies, and its judge: a
   `[judges.NAME]` of env.toml, which `judge=NAME` also selects)
4. command-line overrides (`a.b=1`, `+a.c=2`, `~a.d`, `deployment=vllm`, `judge=NAME`)
5. the `-t` task filter

Hydra's compose API does 1-4 (so `defaults` lists really compose config groups); 5 is applied to the
composed config before interpolations are resolved.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ckpteval.config.executors import find_executor
from ckpteval.config.override_hints import group_hint, missing_key_hint
from ckpteval.config.paths import is_dir, is_file
from ckpteval.config.profiles import EnvFile, Profile, load_env_file, user_config_dir
from ckpteval.config.secrets import SecretValues, collect_environment_secrets
from ckpteval.errors import CkptevalError, ConfigError

if TYPE_CHECKING:
    from ckpteval.config.resolvers import ArtifactResolver
    from ckpteval.tasks.catalog import Catalog

Mode = Literal["local", "run", "batch"]
PACKAGED_CONF = Path(__file__).resolve().parent.parent / "conf"
CONFIG_PATH_VAR = "CKPTEVAL_CONFIG_PATH"
_PRIMARY = "__ckpteval_primary__"
_PROFILE = "__ckpteval_profile__"
_SECTIONS = "__ckpteval_sections__"
_TASK_FILTER = "__ckpteval_task_filter__"
_MAX_NAME = 200  # a config name longer than this cannot be a file name (most filesystems: 255 bytes)


@dataclass(frozen=True)
class CompileRequest:
    """Everything the command line says about what to compile."""

    configs: tuple[str, ...] = ()
    profile: str | None = None
    mode: Mode = "local"
    overrides: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    env_file: Path | None = None
    cwd: Path = field(default_factory=Path.cwd)


@dataclass(frozen=True)
class Layers:
    """What Hydra composes, in order: config names, then overrides (profile's before the CLI's)."""

    configs: tuple[str, ...]
    overrides: tuple[str, ...]
    profile_node: dict[str, Any]
    task_filter: tuple[str, ...]


@dataclass(frozen=True)
class ComposedConfig:
    """The composed config before typing: resolved plain data plus where it came from."""

    data: dict[str, Any]
    profile: Profile
    env: EnvFile
    search_path: tuple[Path, ...]
    config_files: tuple[Path, ...]
    secrets: SecretValues
    added_tasks: tuple[str, ...] = ()
    artifacts: tuple[Any, ...] = ()  # ResolvedArtifact: W&B model artifacts ${art:...} resolved


def config_search_path(env: EnvFile) -> tuple[Path, ...]:
    """Where config names are looked up, first match wins: $CKPTEVAL_CONFIG_PATH, env.toml [cli]
    config_dirs, the user config dir's `conf/`, then the packaged `conf/`."""
    dirs: list[Path] = []
    for entry in os.environ.get(CONFIG_PATH_VAR, "").split(os.pathsep):
        if entry:
            dirs.append(Path(entry).expanduser().resolve())
    dirs.extend(env.config_dirs)
    user_conf = user_config_dir() / "conf"
    if user_conf.is_dir():
        dirs.append(user_conf)
    dirs.append(PACKAGED_CONF)
    return tuple(dict.fromkeys(d for d in dirs if d.is_dir() or d == PACKAGED_CONF))


def available_configs(search_path: Sequence[Path]) -> list[str]:
    """Names `-c` accepts (top-level YAML files of every config dir)."""
    names: set[str] = set()
    for directory in search_path:
        names.update(p.stem for p in directory.glob("*.y*ml") if p.suffix in (".yaml", ".yml"))
    return sorted(names)


def _is_path(ref: str) -> bool:
    return "/" in ref or ref.endswith((".yaml", ".yml")) or ref.startswith("~")


def locate_config(ref: str, search_path: Sequence[Path], cwd: Path) -> tuple[str, Path]:
    """(name Hydra can compose, file) for a `-c` value: a name in the search path or a YAML path."""
    if _is_path(ref):
        path = Path(ref).expanduser()
        path = path if path.is_absolute() else cwd / path
        if is_dir(path):
            raise ConfigError(
                f"Config {ref} is a directory, not a YAML file.",
                hint="Pass a YAML file (-c path/to/stage.yaml), or add the directory to env.toml [cli] config_dirs "
                "and pass a config name.",
            )
        if not is_file(path):
            raise ConfigError(f"Config file {ref} does not exist.", hint="Check the path, or pass a config name.")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"Config file {ref} is not readable.", hint=f"Check its permissions: chmod u+r {ref}")
        return "", path.resolve()
    names = [n for n in available_configs(search_path) if n != "default"]
    if len(ref) > _MAX_NAME:
        raise ConfigError(
            f"Unknown config '{ref[:40]}...' ({len(ref)} characters; config names are file names).",
            hint="Configs that exist: " + ", ".join(names) + ". Or pass a path to a YAML file.",
        )
    for directory in search_path:
        for suffix in (".yaml", ".yml"):
            candidate = directory / f"{ref}{suffix}"
            if is_file(candidate):
                return ref, candidate
    from ckpteval.errors import did_you_mean

    raise ConfigError(
        f"Unknown config '{ref}'.{did_you_mean(ref, names)}",
        hint="Configs that exist: " + ", ".join(names) + ". Or pass a path to a YAML file.",
    )


def profile_node(profile: Profile, env: EnvFile) -> dict[str, Any]:
    """The profile as a config layer: `run.env`, `run.wandb`, the execution group it selects and its judge."""
    node: dict[str, Any] = {"run": {"env": profile.to_config()}}
    wandb = {k: v for k, v in (("entity", env.wandb.entity), ("project", env.wandb.project)) if v is not None}
    if wandb:
        node["run"]["wandb"] = wandb
    group = find_executor(profile.executor).config_group
    judge = [{"override /judge": profile.judge}] if profile.judge else []  # a [judges.NAME] of env.toml
    node["defaults"] = [{"override /execution": group}, *judge, "_self_"]
    return node


def composition_layers(
    request: CompileRequest, profile: Profile, env: EnvFile, config_names: Sequence[str], *, sections: bool = False
) -> Layers:
    """The one place that decides precedence: registered sections (`sections`: when there are any beyond the
    packaged ones) < defaults < -c configs < profile < overrides < -t."""
    return Layers(
        configs=(*([_SECTIONS] if sections else []), "default", *config_names, _PROFILE),
        overrides=tuple(request.overrides),
        profile_node=profile_node(profile, env),
        task_filter=tuple(request.tasks),
    )


def task_names(request: CompileRequest, *, catalog: Catalog | None = None) -> list[str]:
    """The names of the tasks the request's config (and `-t` filter) evaluates, without resolving anything
    else (a config that needs `run.model` still answers: `evaluate data fetch -c pretrain`)."""
    from omegaconf import OmegaConf

    cfg, *_ = _compose_unresolved(request, catalog)
    tasks = OmegaConf.select(cfg, "evaluation.tasks", default=None) or []
    return [str(OmegaConf.select(task, "name", throw_on_missing=False)) for task in tasks]


def _compose_unresolved(
    request: CompileRequest, catalog: Catalog | None
) -> tuple[Any, Profile, EnvFile, tuple[Path, ...], list[Path], tuple[str, ...]]:
    env = load_env_file(request.env_file, cwd=request.cwd)
    profile = env.profile(request.profile)
    if request.mode != "local" and request.profile is None:  # the built-in profile runs attached only
        raise ConfigError("--run/--batch need a profile name.")
    search_path = config_search_path(env)

    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    names: list[str] = []
    files: list[Path] = []
    for i, ref in enumerate(request.configs):
        name, path = locate_config(ref, search_path, request.cwd)
        if not name:  # a path: load it ourselves and hand Hydra an in-memory node
            name = f"__ckpteval_cli_{i}__"
            store.store(name=name, node=_load_yaml(path))
        names.append(name)
        files.append(path)

    sections = _store_registered_sections(store, search_path)
    _store_named_judges(store, env)
    layers = composition_layers(request, profile, env, names, sections=sections)
    store.store(name=_PROFILE, node=layers.profile_node)
    store.store(name=_PRIMARY, node={"defaults": [*layers.configs, "_self_"]})

    check_overrides_are_text(layers.overrides)
    cfg = _hydra_compose(search_path, layers.overrides)
    added = apply_task_filter(cfg, layers.task_filter, catalog)
    return cfg, profile, env, search_path, files, added


def _store_registered_sections(store: Any, search_path: Sequence[Path]) -> bool:
    """Layer 0 (see the module docstring): the defaults of each export section the packaged config does not
    declare, a required key as `???`; and `deployment=<type>` for a registered type with no yaml. Whether
    there is a layer 0 (without sections registered beyond the shipped ones there is none: no cost)."""
    from ckpteval.config.schema import DEPLOYMENT_TYPES, EXPORT_SECTIONS, SHIPPED_EXPORT_SECTIONS
    from ckpteval.registry import load_installed

    load_installed("deployments")  # an installed package's sections, before the config is composed and typed
    load_installed("destinations")
    for name, cls in DEPLOYMENT_TYPES.items():
        if not any(is_file(d / "deployment" / f"{name}.yaml") for d in search_path):
            store.store(group="deployment", name=name, node={**section_defaults(cls), "type": name})
    added = {
        name: section_defaults(cls) for name, cls in EXPORT_SECTIONS.items() if name not in SHIPPED_EXPORT_SECTIONS
    }
    if added:
        store.store(name=_SECTIONS, node={"export": added})
    return bool(added)


_NAMED_JUDGES: set[str] = set()  # the env.toml judges last stored: another env.toml's must not linger


def _store_named_judges(store: Any, env: EnvFile) -> None:
    """env.toml's [judges.NAME] as options of the `judge` group: `judge=NAME` (or a profile's `judge = NAME`)
    selects one as it selects a packaged judge, and an unknown name is answered with the close ones."""
    group = store.repo.get("judge") or {}
    for name in _NAMED_JUDGES - set(env.judges):
        group.pop(f"{name}.yaml", None)
    _NAMED_JUDGES.clear()
    for name, node in env.judges.items():
        store.store(group="judge", name=name, node=node)
        _NAMED_JUDGES.add(name)


def section_defaults(section: type) -> dict[str, Any]:
    """A section's keys with their defaults as plain data; `???` (required) where it has none."""
    import dataclasses

    def plain(value: Any) -> Any:
        return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value

    node: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            node[f.name] = plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            node[f.name] = plain(f.default_factory())
        else:
            node[f.name] = "???"
    return node


def compose(
    request: CompileRequest, *, catalog: Catalog | None = None, resolve_artifact: ArtifactResolver | None = None
) -> ComposedConfig:
    """Compose and resolve the config a request describes (no typing or semantic checks yet).

    `-t` names are looked up in `catalog` (the one `compile_config` then resolves every task against;
    loaded here only when none is given and `-t` is used). `${art:...}` naming a model artifact goes
    through `resolve_artifact` (none given: such a reference is a ConfigError)."""
    cfg, profile, env, search_path, files, added = _compose_unresolved(request, catalog)

    from ckpteval.config.resolvers import collecting_secrets, register_resolvers, resolved_artifacts, stop_collecting

    register_resolvers()
    secrets = collect_environment_secrets()
    token = collecting_secrets(secrets, resolve_artifact)
    try:
        data = _resolve(cfg)
        artifacts = tuple(resolved_artifacts())
    finally:
        stop_collecting(token)
    if not isinstance(data, dict):
        raise ConfigError("The composed config is not a mapping.")
    data.pop("hydra", None)
    return ComposedConfig(
        data=data,
        profile=profile,
        env=env,
        search_path=search_path,
        config_files=tuple(files),
        secrets=secrets,
        added_tasks=added,
        artifacts=artifacts,
    )


def _load_yaml(path: Path) -> Any:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    try:
        node = OmegaConf.load(path)
    except (YAMLError, OmegaConfBaseException) as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"{path} is not a text file (it is not UTF-8), so it cannot be a YAML config.",
            hint="Pass a stage config YAML (-c path/to/stage.yaml) or a config name.",
        ) from None
    except OSError as exc:
        raise ConfigError(f"Cannot read {path}: {exc.strerror}.") from None
    if not isinstance(OmegaConf.to_container(node), dict):
        raise ConfigError(f"{path} must hold a mapping (sections like evaluation:, deployment:).")
    return OmegaConf.to_container(node)


def check_overrides_are_text(overrides: Sequence[str]) -> None:
    """An override holding bytes that are not UTF-8 (a shell passes them through) is refused by name,
    before Hydra's parser reports it as a syntax error at some odd character."""
    for ov in overrides:
        try:
            ov.encode("utf-8")
        except UnicodeEncodeError:
            shown = ov.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise ConfigError(
                f"Override {shown!r} holds bytes that are not UTF-8 text.",
                hint="Write the value as UTF-8 text (check the shell variable or file it came from).",
            ) from None


def _hydra_compose(search_path: Sequence[Path], overrides: Sequence[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    primary, *rest = search_path
    searchpath = "hydra.searchpath=[" + ",".join(f"file://{d}" for d in rest) + "]"
    try:
        with initialize_config_dir(config_dir=str(primary), version_base=None):
            return hydra_compose(_PRIMARY, overrides=[searchpath, *overrides])
    except OverrideParseException as exc:
        bad = _offending_override(str(exc), overrides)
        raise ConfigError(
            f"Malformed override{f' {bad!r}' if bad else ''}: {_first_line(str(exc))}.",
            hint="Overrides look like key=value, +new.key=value, ~key, or group=option (deployment=vllm).",
        ) from None
    except MissingConfigException as exc:
        group, _, option = (exc.missing_cfg_file or "").rpartition("/")
        if group and exc.options:
            raise ConfigError(
                f"Unknown {group} {option!r}.", hint=group_hint(group, option, sorted(exc.options))
            ) from None
        raise ConfigError(_clean_hydra_message(str(exc)), hint="Check the spelling of the config group.") from None
    except (HydraException, OmegaConfBaseException) as exc:
        message = _clean_hydra_message(str(exc))
        hint = None
        if "To append to your config use" in message:
            head = message.partition("\n")[0]
            key = head.removeprefix("Could not override '").split("'")[0]
            message = f"Cannot override '{key}': the config has no such key."
            hint = _missing_key_hint(search_path, overrides, key)
        elif "Multiple values for" in message:
            hint = (
                "Stage configs are layers over the packaged default: write `override /GROUP: OPTION` "
                "in their defaults list instead of selecting a group again."
            )
        raise ConfigError(message, hint=hint) from None


def _missing_key_hint(search_path: Sequence[Path], overrides: Sequence[str], key: str) -> str:
    """The close key, or the deeper real path, of an override naming no key: read from the config
    composed with the group selections only."""
    from omegaconf import OmegaConf

    mine = [o for o in overrides if o.partition("=")[0] == key]
    value = mine[0].partition("=")[2] if mine else "VALUE"
    # the shape of the config is set by its group selections (deployment=vllm), not by value overrides
    groups = [o for o in overrides if "=" in o and "." not in o.partition("=")[0] and o[0] not in "+~"]
    try:
        tree = OmegaConf.to_container(_hydra_compose(search_path, [o for o in groups if o not in mine]))
    except ConfigError:  # a group selection is wrong too: it is reported once this override is fixed
        tree = {}
    return missing_key_hint({str(k): v for k, v in tree.items()} if isinstance(tree, dict) else {}, key, value)


def _first_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("See https://")]
    return lines[-1].strip() if lines else text


def _offending_override(message: str, overrides: Sequence[str]) -> str | None:
    for line in message.splitlines():
        if line.startswith("Error parsing override '"):
            return line.removeprefix("Error parsing override '").rstrip("'")
    for ov in overrides:
        if "=" not in ov and not ov.startswith("~"):
            return ov
    return None


def _clean_hydra_message(message: str) -> str:
    # Drop Hydra's search-path dump and doc links: they point at internals, not at the fix.
    kept = []
    for line in message.splitlines():
        if line.startswith(("Config search path:", "\tprovider=", "See https://")):
            break
        kept.append(line)
    return "\n".join(kept).strip().replace(f"In '{_PRIMARY}': ", "")


def parse_task_ref(ref: str) -> tuple[str, int | None]:
    """`-t` value -> (task name, repeats): `gsm8k` (repeats as configured), `gsm8k:0` (greedy),
    `gsm8k:4` (4 samples per problem). A malformed suffix is a ConfigError."""
    name, sep, count = ref.partition(":")
    if not sep:
        return ref, None
    if not name or not (count.isascii() and count.isdigit()):
        raise ConfigError(
            f"Bad task '{ref}': the part after ':' must be a number of samples per problem.",
            hint=f"Write {name or 'TASK'}:4 for 4 samples per problem, {name or 'TASK'}:0 (or no suffix) for greedy.",
        )
    return name, int(count)


def apply_task_filter(cfg: Any, refs: Sequence[str], catalog: Catalog | None = None) -> tuple[str, ...]:
    """Keep only the tasks named by `-t` (in `-t` order). A catalog task the config does not list is
    added with the global defaults; returns the names added that way. Unknown names are errors.
    `NAME:K` also sets the task's repeats (see `parse_task_ref`): the `-t` layer is the top of the
    config, and the count goes down from there (compile -> plan layouts -> job files), never back."""
    if not refs:
        return ()
    from omegaconf import OmegaConf, open_dict

    if catalog is None:
        from ckpteval.tasks.catalog import load_catalog

        catalog = load_catalog()
    configured = list(cfg.evaluation.tasks)
    chosen: list[Any] = []
    added: list[str] = []
    repeats_of: dict[str, int | None] = {}
    for ref in dict.fromkeys(refs):
        name, repeats = parse_task_ref(ref)
        spec = catalog.get(name)  # unknown/ambiguous -> ConfigError with close names
        if spec.qualified_name in repeats_of:
            raise ConfigError(
                f"Task {name} is named twice by -t ({ref} and an earlier one).",
                hint="Name each task once; NAME:K sets its samples per problem.",
            )
        repeats_of[spec.qualified_name] = repeats
        matches = [t for t in configured if t.name in (name, spec.name, spec.qualified_name)]
        if not matches:
            matches = [OmegaConf.create({"name": name})]
            added.append(name)
        for task in matches:
            if repeats is not None:
                with open_dict(task):
                    task.repeats = repeats
            chosen.append(task)
    with open_dict(cfg):
        cfg.evaluation.tasks = chosen
    return tuple(added)


def _user_error_in_chain(exc: BaseException) -> CkptevalError | None:
    """Our own error raised inside a resolver, which OmegaConf wraps (possibly twice)."""
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        if isinstance(node, CkptevalError):
            return node
        seen.add(id(node))
        node = node.__cause__ or node.__context__
    return None


def _resolve(cfg: Any) -> Any:
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue, OmegaConfBaseException

    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as exc:
        key = getattr(exc, "full_key", "") or "?"
        raise ConfigError(
            f"'{key}' is required but has no value (??? in the config).",
            hint=f"Set it: {key}=VALUE on the command line, or in your config.",
        ) from None
    except InterpolationResolutionError as exc:
        ours = _user_error_in_chain(exc)
        if ours is not None:
            raise ours from None
        key = getattr(exc, "full_key", "") or "?"
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"Cannot resolve '{key}': {reason}",
            hint="Check the interpolation (${...}) it uses and the key it points to.",
        ) from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"Invalid config: {_first_line(str(exc))}") from None
