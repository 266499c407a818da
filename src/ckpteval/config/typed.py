"""Turn plain mappings (parsed TOML, resolved YAML) into typed dataclasses, with errors a user can fix.

One small converter instead of a validation framework: it knows the handful of types our schemas
use (scalars, Optional, Literal, list, dict, nested dataclasses, Any, and sections typed by a registry:
`Annotated[T, Registered(table)]`) and reports the dotted path of the first bad value, an unknown key with
its closest valid names, or a missing required key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ckpteval.errors import ConfigError, did_you_mean

T = TypeVar("T")

_MISSING = dataclasses.MISSING


@dataclass(frozen=True)
class Registered:
    """`Annotated` metadata: a value typed by a registry's table (name -> section dataclass), read when a
    config is typed, so a section registered after the schema was written is typed like a shipped one.

    `by="type"`: the value is one section, chosen by its own `type` key (`deployment`). `by=None`: each key
    of the value names a section (`export.<name>`); the annotated type is built from the typed mapping."""

    table: Mapping[str, type]
    by: str | None = None


def from_mapping(cls: type[T], data: Any, *, where: str, path: str = "") -> T:
    """Build dataclass `cls` from `data`; `where` names the source in messages (a file, "config")."""
    return typing.cast(T, _convert(cls, data, where=where, path=path))


def typed_value(tp: Any, data: Any, *, where: str, path: str = "") -> Any:
    """`data` typed as `tp`, any schema type (an `Annotated` registry section, say); as `from_mapping`."""
    return _convert(tp, data, where=where, path=path)


def _describe(path: str) -> str:
    return f"'{path}'" if path else "the top level"


def _convert(tp: Any, value: Any, *, where: str, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)

    if tp is Any or tp is object:
        return value
    if origin is typing.Annotated:
        registered = next((m for m in tp.__metadata__ if isinstance(m, Registered)), None)
        if registered is None:
            return _convert(args[0], value, where=where, path=path)
        return _convert_registered(args[0], registered, value, where=where, path=path)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        tagged = _tagged_choice(args, value, where=where, path=path)
        if tagged is not None:
            return _convert(tagged, value, where=where, path=path)
        errors: list[ConfigError] = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where=where, path=path)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        names = " or ".join(_type_name(a) for a in args if a is not type(None))
        raise ConfigError(f"{where}: {_describe(path)} must be {names}, not {value!r}.")
    if origin is typing.Literal:
        if value in args:
            return value
        allowed = ", ".join(repr(a) for a in args)
        raise ConfigError(
            f"{where}: {_describe(path)} is {value!r}; it must be one of {allowed}."
            + (did_you_mean(str(value), [str(a) for a in args]) if isinstance(value, str) else "")
        )
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _convert_dataclass(tp, value, where=where, path=path)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: {_describe(path)} must be a list, not {value!r}.")
        item_tp = args[0] if args else Any
        items = [_convert(item_tp, v, where=where, path=f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple or tp is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: {_describe(path)} must be a table/mapping, not {value!r}.")
        val_tp = args[1] if len(args) == 2 else Any
        return {
            str(k): _convert(val_tp, v, where=where, path=f"{path}.{k}" if path else str(k)) for k, v in value.items()
        }
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: {_describe(path)} must be true or false, not {value!r}.")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: {_describe(path)} must be an integer, not {value!r}.")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: {_describe(path)} must be a number, not {value!r}.")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # YAML and TOML turn "04:00:00"-like or numeric-looking values into numbers; a string field
            # accepts them as their text so `time = 10` and `time = "10"` mean the same.
            return str(value)
        raise ConfigError(f"{where}: {_describe(path)} must be a string, not {value!r}.")
    raise TypeError(f"unsupported schema type {tp!r} at {path}")  # a bug in a schema, not user input


def _tagged_choice(args: tuple[Any, ...], value: Any, *, where: str, path: str) -> Any:
    """For a union of dataclasses told apart by a Literal `type` field, the member `value` selects."""
    members = [a for a in args if a is not type(None)]
    tags: dict[Any, Any] = {}
    for member in members:
        if not (dataclasses.is_dataclass(member) and isinstance(member, type)):
            return None
        tp = typing.get_type_hints(member).get("type")
        if typing.get_origin(tp) is not typing.Literal:
            return None
        for tag in typing.get_args(tp):
            tags[tag] = member
    if not isinstance(value, Mapping):
        return None
    return _chosen(tags, value, "type", where=where, path=path)


def _chosen(tags: Mapping[Any, Any], value: Mapping[Any, Any], by: str, *, where: str, path: str) -> Any:
    """The entry of `tags` that `value[by]` names; a ConfigError naming the choices (and the close one)."""
    tag = value.get(by)
    if isinstance(tag, Hashable) and tag in tags:  # a list or table given as the tag names nothing
        return tags[tag]
    sub = f"{path}.{by}" if path else by
    allowed = ", ".join(repr(t) for t in tags)
    raise ConfigError(
        f"{where}: '{sub}' is {tag!r}; it must be one of {allowed}."
        + (did_you_mean(str(tag), [str(t) for t in tags]) if isinstance(tag, str) else "")
    )


def _refuse_unknown_keys(value: Mapping[Any, Any], valid: Mapping[str, Any], *, where: str, path: str) -> None:
    """A ConfigError for the first key of `value` not in `valid`: its dotted path, the close name, the valid ones."""
    unknown = [k for k in value if k not in valid]
    if unknown:
        key = str(unknown[0])
        full = f"{path}.{key}" if path else key
        raise ConfigError(
            f"{where}: unknown key '{full}'.{did_you_mean(key, list(valid))}",
            hint="Valid keys here: " + ", ".join(sorted(valid)) + ".",
        )


def _convert_registered(tp: Any, registered: Registered, value: Any, *, where: str, path: str) -> Any:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {_describe(path)} must be a table/mapping, not {value!r}.")
    table = registered.table
    if registered.by is not None:
        return _convert(_chosen(table, value, registered.by, where=where, path=path), value, where=where, path=path)
    _refuse_unknown_keys(value, table, where=where, path=path)
    typed = {
        str(k): _convert(table[k], v, where=where, path=f"{path}.{k}" if path else str(k)) for k, v in value.items()
    }
    return tp(typed)


def _type_name(tp: Any) -> str:
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(tp, str(tp))


def _convert_dataclass(cls: type, value: Any, *, where: str, path: str) -> Any:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {_describe(path)} must be a table/mapping, not {value!r}.")
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    _refuse_unknown_keys(value, fields, where=where, path=path)
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        sub = f"{path}.{name}" if path else name
        if name in value:
            kwargs[name] = _convert(hints[name], value[name], where=where, path=sub)
        elif field.default is _MISSING and field.default_factory is _MISSING:
            raise ConfigError(f"{where}: '{sub}' is required but missing.")
    return cls(**kwargs)
