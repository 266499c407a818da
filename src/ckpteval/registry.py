"""One registry helper for every kind of plugin: executors, deployment backends, export destinations, judges.

A `Registry` holds the entries of one kind by name, in registration order. Entries come from code (the
shipped ones register where they are declared; a script or a test registers its own) and from installed
packages: each Python entry point of the kind's group (`ckpteval.executors`, `ckpteval.deployments`,
`ckpteval.destinations`, `ckpteval.judges`) is loaded the first time the registry is asked, wherever ckpteval
runs (this machine, or the job's Python on a cluster, where `python -m ckpteval.export` asks the
destinations). An entry point names a module (importing it registers its entries), an entry, or a function
that returns entries. A plugin that fails to load is one ConfigError naming its package and entry point.

```toml
# a plugin package's pyproject.toml
[project.entry-points."ckpteval.executors"]
k8s = "my_plugin.k8s"          # the module registers its executor when imported
```
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any, Generic, TypeVar, cast

from ckpteval.errors import CkptevalError, ConfigError, did_you_mean

T = TypeVar("T")

GROUP_PREFIX = "ckpteval."
# Where each kind's registry lives: a config is composed and typed before its registry's module is imported
# (the config layer sits below them), so `load_installed` imports it there when a plugin of its kind is
# installed, and the plugin's config section is known when the config is typed.
HOMES = {
    "executors": "ckpteval.config.executors:EXECUTORS",
    "deployments": "ckpteval.deploy.backends:BACKENDS",
    "destinations": "ckpteval.export.destinations:DESTINATIONS",
}


@functools.cache
def installed_entry_points() -> metadata.SelectableGroups:
    """Every installed package's entry points, read once per process (one scan of the installed packages);
    `.select(group=...)` picks one group's."""
    return metadata.entry_points()


def load_installed(kind: str) -> None:
    """Register the installed plugins of `kind` ("deployments", ...) into its registry; without any installed,
    nothing is imported (the registry's module is not loaded for nothing)."""
    if not installed_entry_points().select(group=GROUP_PREFIX + kind):
        return
    module, _, name = HOMES[kind].partition(":")
    registry: Registry[Any] = getattr(importlib.import_module(module), name)
    registry.load_plugins()


class Registry(Generic[T]):
    """The named entries of one kind of plugin (see the module docstring)."""

    def __init__(
        self,
        kind: str,
        *,
        entry_type: type,
        key: Callable[[T], str],
        group: str,
        on_register: Callable[[T], None] | None = None,
        on_unregister: Callable[[T], None] | None = None,
        error: type[CkptevalError] = ConfigError,
    ) -> None:
        self.kind = kind  # in messages: "executor", "deployment backend", "export destination", "judge"
        self.entry_type = entry_type
        self.group = group if group.startswith(GROUP_PREFIX) else GROUP_PREFIX + group
        self._key = key
        self._on_register = on_register
        self._on_unregister = on_unregister
        self._error = error
        self._entries: dict[str, T] = {}
        self._plugins_loaded = False

    def register(self, entry: T) -> T:
        """Add `entry` (a later one of the same name replaces it); returns it, so it can decorate."""
        if self._on_register is not None:
            self._on_register(entry)
        self._entries[self._key(entry)] = entry
        return entry

    def unregister(self, name: str) -> T | None:
        """Forget the entry `name` (a test's, when the test ends); returns it."""
        entry = self._entries.pop(name, None)
        if entry is not None and self._on_unregister is not None:
            self._on_unregister(entry)
        return entry

    def get(self, name: str) -> T | None:
        """The entry `name`, or None."""
        self.load_plugins()
        return self._entries.get(name)

    def find(self, name: str, *, where: str = "", hint: str | None = None) -> T:
        """The entry `name`; otherwise the registry's error naming the ones that exist (and a close one)."""
        found = self.get(name)
        if found is not None:
            return found
        known = ", ".join(repr(n) for n in self._entries) or "none"
        prefix = f"{where}: " if where else ""
        raise self._error(
            f"{prefix}no {self.kind} {name!r} is registered; known: {known}." + did_you_mean(name, self._entries),
            hint=hint or f"Install the package that provides it (entry point group {self.group}), or fix the name.",
        )

    def names(self) -> list[str]:
        """Every registered name, in registration order."""
        self.load_plugins()
        return list(self._entries)

    def entries(self) -> tuple[T, ...]:
        """Every registered entry, in registration order."""
        self.load_plugins()
        return tuple(self._entries.values())

    def load_plugins(self) -> None:
        """Load, once per process, the entry points of this kind's group from the installed packages."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True  # first: a plugin module that asks the registry while it loads
        for point in installed_entry_points().select(group=self.group):
            self._load(point)

    def _load(self, point: metadata.EntryPoint) -> None:
        package = point.dist.name if point.dist is not None else "an installed package"
        try:
            loaded = point.load()
            produced = loaded() if callable(loaded) and not isinstance(loaded, type) else loaded
        except CkptevalError:
            raise
        except Exception as exc:  # a plugin's own failure, whatever it is, is told as the plugin's
            raise ConfigError(
                f"The {self.kind} plugin {point.name!r} of {package} ({point.group}: {point.value}) "
                f"failed to load: {type(exc).__name__}: {exc}.",
                hint=f"Fix or uninstall {package}.",
            ) from None
        for entry in _entries_of(produced):
            if isinstance(entry, self.entry_type):
                self.register(cast(T, entry))


def _entries_of(produced: Any) -> Iterable[Any]:
    """What an entry point gave: one entry, several, or a module (which registered its own when imported)."""
    if isinstance(produced, list | tuple):
        return produced
    return [produced]
