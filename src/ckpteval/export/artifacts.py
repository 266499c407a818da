"""`${art:model,path}` for a W&B model artifact: `run.model=my-model:latest` -> the checkpoint's path.

A checkpoint is far too big to download for every evaluation, and on a cluster it already sits on
the shared filesystem; a model artifact records where. The path comes from, in order:

1. the artifact's metadata `absolute_path` (what Nemotron's training recipes write), else `path`
   (an absolute path; a `file://` URI is accepted);
2. its `file://` references (`artifact.add_reference("file:///lustre/.../ckpt")`): the directory
   that holds every referenced file (one referenced file: that file, say a `.nemo` archive);

and a legacy path to one iteration (`.../iter_0000100`) becomes its checkpoint directory, the
parent. An artifact with neither is an error that says how to add one; nothing is downloaded.

References: `name:alias`, `project/name:alias` or `entity/project/name:alias` (alias `latest`,
`v3`, or any alias); entity and project default to `run.wandb` (env.toml `[wandb]`), then
`$WANDB_ENTITY` / `$WANDB_PROJECT`. The one network call is `fetch_artifact`.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import os
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from ckpteval.errors import ConfigError

if TYPE_CHECKING:
    from ckpteval.export.credentials import WandbKey

FETCH_TIMEOUT_S = 30.0
_ITERATION_DIR = re.compile(r"iter_\d+")
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_TRANSPORT_FAILURES = (
    "did not respond",
    "connection refused",
    "dial tcp",
    "timed out",
    "timeout",
    "deadline",
    "no such host",
)


@dataclass(frozen=True)
class ArtifactRef:
    """A parsed model artifact reference."""

    entity: str | None  # None: the W&B user's default entity
    project: str
    name: str
    alias: str

    @property
    def qualified(self) -> str:
        """`entity/project/name:alias` (or `project/name:alias` without an entity)."""
        prefix = f"{self.entity}/{self.project}" if self.entity else self.project
        return f"{prefix}/{self.name}:{self.alias}"


@dataclass(frozen=True)
class ResolvedArtifact:
    """What a reference resolved to: the checkpoint path, and the artifact version it came from."""

    ref: ArtifactRef
    version: str  # e.g. entity/project/name:v3
    path: str
    rule: str  # which rule gave the path, for the dry run: "metadata absolute_path", "file:// reference"


def parse_artifact_ref(value: str, *, entity: str | None = None, project: str | None = None) -> ArtifactRef:
    """Split `[[entity/]project/]name:alias`; missing parts come from `entity`/`project`."""
    body, sep, alias = value.rpartition(":")
    parts = body.split("/") if sep else []
    if not sep or not alias or not body or len(parts) > 3 or not all(_NAME.fullmatch(p) for p in [*parts, alias]):
        raise ConfigError(
            f"run.model={value!r} is neither a path nor a W&B artifact reference.",
            hint="Use a checkpoint path (/lustre/.../ckpt), or an artifact: name:latest, name:v3, "
            "project/name:alias or entity/project/name:alias.",
        )
    if len(parts) == 3:
        entity, project, name = parts
    elif len(parts) == 2:
        project, name = parts
    else:
        name = parts[0]
    if not project:
        raise ConfigError(
            f"run.model={value!r} names a W&B artifact but no W&B project is set.",
            hint="Set project in env.toml [wandb] (or run.wandb.project=..., or $WANDB_PROJECT), "
            "or write entity/project/name:alias.",
        )
    return ArtifactRef(entity=entity or None, project=project, name=name, alias=alias)


def _as_path(value: str) -> str:
    """A filesystem path from metadata text: `file://` URIs are unwrapped, `~` is not expanded."""
    if value.startswith("file://"):
        return unquote(urlsplit(value).path)
    return value


def _checkpoint_dir(path: str) -> str:
    """A legacy path to one iteration (`<ckpt>/iter_0000100`) becomes the checkpoint directory."""
    path = posixpath.normpath(path)
    return posixpath.dirname(path) if _ITERATION_DIR.fullmatch(posixpath.basename(path)) else path


def checkpoint_path_from(
    metadata: Mapping[str, Any] | None, references: Iterable[tuple[str, str]], *, label: str
) -> tuple[str, str]:
    """(checkpoint path, rule) from an artifact's metadata and its (entry path, reference URI) pairs.

    Raises ConfigError naming `label` when neither gives an absolute path.
    """
    metadata = metadata or {}
    for key in ("absolute_path", "path"):
        raw = metadata.get(key)
        if raw is None or raw == "":
            continue
        if not isinstance(raw, str) or not posixpath.isabs(_as_path(raw)):
            raise ConfigError(
                f"W&B artifact {label}: metadata {key}={raw!r} is not an absolute path.",
                hint="Record the checkpoint's absolute path on the cluster in the artifact's metadata "
                "(absolute_path), or pass run.model=/path/to/checkpoint.",
            )
        return _checkpoint_dir(_as_path(raw)), f"metadata {key}"
    file_refs = [(entry, _as_path(ref)) for entry, ref in references if ref.startswith("file://")]
    if len(file_refs) == 1 and posixpath.basename(file_refs[0][1]) == posixpath.basename(file_refs[0][0]):
        # one referenced file (say a .nemo archive); a checkpoint directory always holds several
        return _checkpoint_dir(file_refs[0][1]), "file:// reference"
    if file_refs:
        # the directory a reference was added from holds every file it lists: their common directory
        root = posixpath.commonpath([posixpath.normpath(ref) for _, ref in file_refs])
        if root != "/":
            return _checkpoint_dir(root), "file:// reference"
        raise ConfigError(
            f"W&B artifact {label} references files with no directory in common; which one is the checkpoint?",
            hint="Set the artifact's metadata absolute_path, or pass run.model=/path/to/checkpoint.",
        )
    raise ConfigError(
        f"W&B artifact {label} does not say where its checkpoint is: no metadata absolute_path/path "
        "and no file:// reference.",
        hint="Log model artifacts with metadata={'absolute_path': '/lustre/.../checkpoint'} or "
        "artifact.add_reference('file:///lustre/.../checkpoint'); or download it "
        "(`wandb artifact get NAME:ALIAS --root DIR`) and pass run.model=DIR.",
    )


def artifact_checkpoint_path(artifact: Any, *, label: str) -> tuple[str, str]:
    """(checkpoint path, rule) for a `wandb.Artifact` (fetched, or built in memory)."""
    entries = artifact.manifest.entries.values()
    references = [(entry.path, entry.ref) for entry in entries if entry.ref]
    return checkpoint_path_from(artifact.metadata, references, label=label)


def fetch_artifact(ref: ArtifactRef, *, key: WandbKey, base_url: str | None, timeout: float) -> Any:
    """The artifact from the W&B server (the only network call of a resolution).

    Raises ConfigError with the fix: not found, key rejected, server unreachable.
    """
    import wandb
    from wandb.errors import AuthenticationError, CommError
    from wandb.errors import Error as WandbError

    where = base_url or "W&B"
    overrides = {"base_url": base_url} if base_url else {}
    try:
        api = wandb.Api(api_key=key.value, overrides=overrides, timeout=int(timeout))
        return api.artifact(ref.qualified)
    except ValueError as exc:  # wandb's "project ... not found" / "artifact membership ... not found"
        raise ConfigError(
            f"W&B artifact {ref.qualified} does not exist: {exc}.",
            hint="Check the name and alias (`wandb artifact ls PROJECT`), and entity/project in env.toml [wandb].",
        ) from None
    except AuthenticationError as exc:
        # wandb reports "could not verify the key" both when the server says no and when it does not
        # answer; only the text tells them apart
        text = str(exc)
        unreachable = any(marker in text.lower() for marker in _TRANSPORT_FAILURES)
        raise ConfigError(
            f"Cannot resolve W&B artifact {ref.qualified}: {text}",
            hint=f"Is {where} reachable from here? Check your network or WANDB_BASE_URL, "
            "or pass run.model=/path/to/checkpoint."
            if unreachable
            else "W&B rejected your key: run `wandb login --relogin` (or set WANDB_API_KEY).",
        ) from None
    except (CommError, WandbError) as exc:
        raise ConfigError(
            f"Cannot resolve W&B artifact {ref.qualified}: {exc}",
            hint=f"Is {where} reachable from here? Check your network or WANDB_BASE_URL, "
            "or pass run.model=/path/to/checkpoint.",
        ) from None


def resolve_model_artifact(value: str, *, wandb_settings: Any = None) -> ResolvedArtifact:
    """Resolve `run.model` naming a W&B model artifact to its checkpoint path (see the module doc).

    `wandb_settings` is `run.wandb` (entity, project), a mapping or None. Raises ConfigError before
    anything is submitted: not logged in, artifact missing or unreachable, no path recorded.
    """
    from ckpteval.export.credentials import LOGIN_HINT_SHORT, announce_login, find_wandb_key, wandb_base_url

    settings = wandb_settings or {}
    ref = parse_artifact_ref(
        value,
        entity=settings.get("entity") or os.environ.get("WANDB_ENTITY"),
        project=settings.get("project") or os.environ.get("WANDB_PROJECT"),
    )
    key = find_wandb_key()
    if key is None:
        raise ConfigError(
            f"run.model={value} is a W&B artifact, but no W&B login was found to look it up.",
            hint=LOGIN_HINT_SHORT + "; or pass run.model=/path/to/checkpoint.",
        )
    announce_login(key)
    artifact = fetch_artifact(ref, key=key, base_url=wandb_base_url(), timeout=FETCH_TIMEOUT_S)
    version = str(artifact.qualified_name)  # entity/project/name:vN, the version the alias points at now
    path, rule = artifact_checkpoint_path(artifact, label=version)
    return ResolvedArtifact(ref=ref, version=version, path=path, rule=rule)
