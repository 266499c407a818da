"""Hints for an override that names no key of the config: the close key that exists first, then the real
path of a key that exists deeper (`evaluation.limit_samples` -> `evaluation.nemo_evaluator_config.config.
params.limit_samples`), and only then `+key=value` for a key that is meant to be new."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ckpteval.errors import close_matches


def missing_key_hint(tree: Mapping[str, Any], key: str, value: str) -> str:
    """What to write instead of `key=value`, given the composed config (as plain data) it did not fit: the
    key with its first misspelled part corrected (`exection.output_dir` -> `execution.output_dir`), the section
    corrected, with its keys, where the leaf is none of them (`exection.x`), the real path of a key that exists
    deeper, and only then `+key=value`."""
    corrected = _corrected(tree, key.split("."))
    if corrected is not None:
        return f"Did you mean {corrected}={value}?"
    parent_path, _, leaf = key.rpartition(".")
    section = _corrected(tree, parent_path.split(".")) if parent_path else None
    keys = _node(tree, section) if section is not None else None
    if isinstance(keys, Mapping):  # `exection.x`: the section misspelled, and no key of it close to the leaf
        listed = ", ".join(str(k) for k in keys)
        return f"No section {parent_path!r}: did you mean {section}? Its keys: {listed}."
    deeper = [path for path in _paths(tree) if path.endswith(f".{leaf}") and path.startswith(parent_path)]
    if deeper:
        return f"The key is {deeper[0]}: write {deeper[0]}={value}."
    return f"To add a new key, write +{key}={value} (or check the spelling)."


def _corrected(tree: Mapping[str, Any], parts: list[str]) -> str | None:
    """`parts` with each part that is not in the config replaced by its close match, when what follows
    then exists (a new leaf under an existing section counts); None when no such spelling is found."""
    node: Any = tree
    out: list[str] = []
    changed = False
    for i, part in enumerate(parts):
        if not isinstance(node, Mapping):
            return None
        if part not in node:
            close = close_matches(part, [str(k) for k in node], n=1)
            if not close:
                return None
            part, changed = close[0], True
        elif i == len(parts) - 1 and not changed:
            return None
        out.append(part)
        node = node[part]
    return ".".join(out) if changed else None


def group_hint(group: str, option: str, options: list[str]) -> str:
    """`deployment=vlm`: the close option of the config group, and the options that exist."""
    close = close_matches(option, options, n=1)
    listed = f"Options of {group}: {', '.join(options)}."
    return f"Did you mean {group}={close[0]}? {listed}" if close else listed


def _node(tree: Mapping[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split(".") if path else ():
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _paths(tree: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for k, v in tree.items():
        path = f"{prefix}{k}"
        yield path
        if isinstance(v, Mapping):
            yield from _paths(v, path + ".")
