"""`deep_merge`: the one way ckpteval layers one mapping over another (profiles, task settings, run configs)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `top` merged in, key by key: nested mappings merge, anything else in `top`
    replaces what `base` has. Neither input is changed."""
    out = copy.deepcopy(dict(base))
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
