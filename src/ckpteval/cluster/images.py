"""Container image references: check them, turn them into enroot URIs, name their .sqsh.

The images a job runs in are its plan's steps' (`ckpteval.cluster.submission.job_images`). A Docker
reference there (`nvcr.io/nvidia/nemo:25.09`) is squashed on the cluster; a value that already ends
in `.sqsh` or is an absolute path is a file on the cluster and is left alone.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ckpteval.errors import ConfigError

ENROOT_SCHEMES = ("docker://", "dockerd://", "podman://")
# what a registry reference may contain (Docker's grammar, enroot's `[USER@][REGISTRY#]` prefix,
# `@sha256:` digests); anything else (spaces, quotes, `;`, `$`) is refused before it goes anywhere
_IMAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@#-]*")
_READABLE_MAX = 100


@dataclass(frozen=True)
class ImageRef:
    """One image reference found in a config, and where (`deployment.image`, `evaluation.tasks[0].container`)."""

    dotpath: str
    image: str


def is_squashable(value: str) -> bool:
    """True for a registry reference; False for a .sqsh file or an absolute path (used as they are)."""
    return not (value.endswith(".sqsh") or value.startswith("/"))


def validate_image(image: str, *, where: str = "") -> None:
    """Raise ConfigError unless `image` is a plausible registry reference (no shell syntax, no spaces)."""
    body = image
    for scheme in ENROOT_SCHEMES:
        if body.startswith(scheme):
            body = body[len(scheme) :]
            break
    if not _IMAGE_RE.fullmatch(body):
        bad = sorted({c for c in body if not re.fullmatch(r"[A-Za-z0-9._/:@#-]", c)})
        shown = ", ".join(repr(c) for c in bad) or "its first character"
        raise ConfigError(
            f"{where + ': ' if where else ''}{image!r} is not a container image reference (it contains {shown}).",
            hint="Use a registry reference like nvcr.io/nvidia/nemo:25.09, or a .sqsh path on the cluster.",
        )


def enroot_uri(image: str) -> str:
    """The URI `enroot import` needs: `docker://[REGISTRY#]IMAGE[:TAG]`.

    Docker's rule decides whether the first path component is a registry: it contains a `.` or a
    `:`, or is `localhost` (`nvcr.io/nvidia/nemo:25.09` -> `docker://nvcr.io#nvidia/nemo:25.09`).
    """
    if image.startswith(ENROOT_SCHEMES):
        return image
    if "#" in image:
        return "docker://" + image
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"docker://{first}#{rest}"
    return "docker://" + image


def sqsh_name(image: str) -> str:
    """The cache file name for an image: readable, and unique through a hash of its enroot URI.

    `nvcr.io/nvidia/nemo:25.09` -> `nvcr.io+nvidia+nemo+25.09-<10 hex>.sqsh`. The same image
    written as `docker://nvcr.io#nvidia/nemo:25.09` gets the same name.
    """
    uri = enroot_uri(image)
    body = uri.split("://", 1)[1]
    readable = re.sub(r"[^A-Za-z0-9._-]+", "+", body).strip("+.")[:_READABLE_MAX] or "image"
    digest = hashlib.sha256(uri.encode()).hexdigest()[:10]
    return f"{readable}-{digest}.sqsh"
