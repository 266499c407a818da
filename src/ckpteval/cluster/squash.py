"""Auto-squash: every Docker image of a cluster run becomes a cached `.sqsh` on the cluster.

For each image reference (see `ckpteval.cluster.images`) the cache file is
`${remote_job_dir}/containers/<name>.sqsh`. One round trip on the invocation's connection checks
which exist (a cache hit costs nothing more). A missing one is imported by `enroot import` on a
compute node (`srun` with the profile's account and build partition/time), with enroot's cache
and data dirs under `${remote_job_dir}/containers/.enroot`, into `<name>.sqsh.part`, renamed into
place only when complete, under an flock on `<name>.sqsh.lock` so two invocations never import
the same image twice (the second waits and then finds the file). `force=True` re-imports.
The script that does this on the login node is `squash_import.sh`; every value reaches it as a
quoted argument.
"""

from __future__ import annotations

import importlib.resources
import posixpath
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ckpteval.cluster.connect import connect_remote
from ckpteval.cluster.images import (
    ImageRef,
    enroot_uri,
    sqsh_name,
    validate_image,
)
from ckpteval.cluster.remote import Remote, RunResult
from ckpteval.errors import ClusterError, ConfigError

if TYPE_CHECKING:
    from ckpteval.config.profiles import Profile

CONTAINERS_DIR = "containers"
STATUS_PREFIX = "ckpteval-squash: "

Status = Literal["present", "missing", "unchecked"]


@dataclass(frozen=True)
class BuildSettings:
    """Where `enroot import` runs: the srun options of the build step."""

    account: str | None
    partition: str | None
    time: str
    gpus_per_node: int | None  # None: no GPUs requested

    def srun_argv(self) -> list[str]:
        """`srun ...` that runs one task on one compute node (the import command follows it)."""
        argv = ["srun", "--nodes=1", "--ntasks=1", "--job-name=ckpteval-squash", "--export=ALL", f"--time={self.time}"]
        if self.account:
            argv.append(f"--account={self.account}")
        if self.partition:
            argv.append(f"--partition={self.partition}")
        if self.gpus_per_node:
            argv.append(f"--gpus-per-node={self.gpus_per_node}")
        return argv


@dataclass(frozen=True)
class SquashItem:
    """One image to squash: where its .sqsh goes and whether it is already there."""

    image: str  # as written in the config
    uri: str  # what `enroot import` is given
    path: str  # the .sqsh on the cluster
    dotpaths: tuple[str, ...]  # where the config uses it
    status: Status

    @property
    def needs_import(self) -> bool:
        """True unless the .sqsh is known to be present."""
        return self.status != "present"


@dataclass(frozen=True)
class SquashPlan:
    """What squashing will do: per image, hit or import; `checked` says whether the cluster was asked."""

    host: str
    containers_dir: str
    items: tuple[SquashItem, ...]
    checked: bool
    force: bool
    build: BuildSettings

    def action(self, item: SquashItem) -> str:
        """`use`, `import`, `re-import` (forced) or `import if missing` (not checked)."""
        if self.force:
            return "re-import"
        if item.status == "present":
            return "use"
        return "import" if item.status == "missing" else "import if missing"

    @property
    def mapping(self) -> dict[str, str]:
        """image reference -> .sqsh path (what `ckpteval.cluster.submission.with_images` swaps in)."""
        return {item.image: item.path for item in self.items}


@dataclass(frozen=True)
class SquashEvent:
    """Progress of `ensure_squashed`, for a display: one per state change or output line."""

    kind: Literal["checked", "hit", "waiting", "importing", "output", "imported"]
    item: SquashItem | None = None
    text: str = ""
    elapsed: float = 0.0  # seconds since this item's import started


@dataclass(frozen=True)
class SquashResult:
    """What `ensure_squashed` did."""

    plan: SquashPlan
    imported: tuple[str, ...] = ()  # images that were imported by this call
    seconds: float = 0.0
    import_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def mapping(self) -> dict[str, str]:
        """image reference -> .sqsh path."""
        return self.plan.mapping


EventCallback = Callable[[SquashEvent], None]


def squash_applies(profile: Profile) -> bool:
    """Whether runs on this profile need .sqsh images (Slurm clusters, reached by SSH or locally: their job steps
    run in enroot containers; a machine reached over SSH runs them in its Python, with no images)."""
    from ckpteval.config.executors import SlurmProfile

    return isinstance(profile.part, SlurmProfile)


def containers_dir(profile: Profile) -> str:
    """`${remote_job_dir}/containers` (ConfigError if remote_job_dir is missing or relative)."""
    from ckpteval.config.executors import slurm_part

    rjd = slurm_part(profile).remote_job_dir
    if not rjd:
        raise ConfigError(
            f"Profile [{profile.name}] has no `remote_job_dir`, where the .sqsh images are cached.",
            hint='Set remote_job_dir = "/lustre/.../ckpteval" (a directory you can write on the cluster) in env.toml.',
        )
    if not rjd.startswith("/"):
        raise ConfigError(
            f"Profile [{profile.name}]: remote_job_dir must be an absolute path on the cluster, not {rjd!r}.",
            hint="Write it out in full (~ and $HOME are not expanded).",
        )
    return posixpath.join(posixpath.normpath(rjd), CONTAINERS_DIR)


def build_settings(profile: Profile) -> BuildSettings:
    """The srun settings of the import step: build_partition/build_time, else the run's."""
    from ckpteval.config.executors import slurm_part

    part = slurm_part(profile)
    return BuildSettings(
        account=part.account,
        partition=part.build_partition or part.partition,
        time=part.build_time or part.time,
        gpus_per_node=part.gpus_per_node if part.build_include_gpus else None,
    )


def _group(images: Sequence[ImageRef]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for ref in images:
        validate_image(ref.image, where=ref.dotpath)
        grouped.setdefault(ref.image, []).append(ref.dotpath)
    return grouped


def _check_present(remote: Remote, paths: Sequence[str]) -> list[bool]:
    """One round trip: which of `paths` exist (non-empty files)."""
    if not paths:
        return []
    script = 'for f in "$@"; do if [ -s "$f" ]; then echo 1; else echo 0; fi; done'
    result = remote.run(["sh", "-c", script, "ckpteval-check", *paths], timeout=120)
    flags = result.stdout.split()
    if len(flags) != len(paths):
        raise ClusterError(
            f"Unexpected answer from {remote.description} while checking the .sqsh cache: {result.stdout!r}."
        )
    return [flag == "1" for flag in flags]


def plan_squash(
    images: Sequence[ImageRef],
    profile: Profile,
    *,
    check: bool,
    remote: Remote | None = None,
    force: bool = False,
) -> SquashPlan:
    """Which images go where, and (with `check`) which are already on the cluster.

    Without `check` nothing is contacted (the dry-run preview). With `check` the cluster is asked
    read-only, in one round trip, on `remote` or on a connection opened and closed here.
    """
    directory = containers_dir(profile)
    grouped = _group(images)
    paths = [posixpath.join(directory, sqsh_name(image)) for image in grouped]
    present: list[bool | None] = [None] * len(paths)
    if check and paths:
        own = remote is None
        conn = remote if remote is not None else connect_remote(profile)
        try:
            present = list(_check_present(conn, paths))
        finally:
            if own:
                conn.close()
    items = tuple(
        SquashItem(
            image=image,
            uri=enroot_uri(image),
            path=path,
            dotpaths=tuple(dotpaths),
            status="unchecked" if flag is None else ("present" if flag else "missing"),
        )
        for (image, dotpaths), path, flag in zip(grouped.items(), paths, present, strict=True)
    )
    from ckpteval.config.executors import slurm_part

    part = slurm_part(profile)
    host = "this machine" if part.tunnel == "local" else (part.host or "?")
    return SquashPlan(
        host=host, containers_dir=directory, items=items, checked=check, force=force, build=build_settings(profile)
    )


def import_script() -> str:
    """The bash script that imports one image on the login node (see squash_import.sh)."""
    text = importlib.resources.files("ckpteval.cluster").joinpath("squash_import.sh").read_text(encoding="utf-8")
    # comments stay in the file for readers; the command line (and the debug log) gets the code only
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def import_command(item: SquashItem, plan: SquashPlan, *, force: bool) -> list[str]:
    """The argv that imports `item` on the login node; every value is a separate, quoted word."""
    enroot_dir = posixpath.join(plan.containers_dir, ".enroot")
    return [
        "bash",
        "-c",
        import_script(),
        "ckpteval-squash",
        item.path,
        item.uri,
        "1" if force else "0",
        posixpath.join(enroot_dir, "cache"),
        posixpath.join(enroot_dir, "data"),
        *plan.build.srun_argv(),
    ]


def import_image(
    remote: Remote,
    item: SquashItem,
    plan: SquashPlan,
    *,
    force: bool = False,
    on_event: EventCallback | None = None,
) -> bool:
    """Import one image into its .sqsh on the cluster; True if imported, False if it was (or became) present.

    Raises ClusterError with enroot's own error when the import fails; nothing is left behind then.
    """
    emit = on_event or (lambda _e: None)
    start = time.monotonic()
    errors: list[str] = []
    outcome: dict[str, str] = {}

    def on_line(stream: str, line: str) -> None:
        elapsed = time.monotonic() - start
        if stream == "stdout" and line.startswith(STATUS_PREFIX):
            state, _, rest = line[len(STATUS_PREFIX) :].partition(" ")
            outcome["state"] = state
            if state in ("waiting", "importing"):
                emit(SquashEvent(state, item, rest, elapsed))  # type: ignore[arg-type]
            return
        if stream == "stderr":
            errors.append(line)
        if line.strip():
            emit(SquashEvent("output", item, line, elapsed))

    result = remote.stream(import_command(item, plan, force=force), on_line=on_line, hold_stdin=True)
    if result.returncode != 0:
        raise _import_error(result, item, remote, errors)
    state = outcome.get("state")
    if state == "present":
        emit(SquashEvent("hit", item, "imported meanwhile by another invocation", time.monotonic() - start))
        return False
    if state != "imported":
        raise ClusterError(
            f"The import of {item.image} on {remote.description} ended without saying so: "
            f"{(result.stdout + result.stderr).strip()[-500:]!r}."
        )
    emit(SquashEvent("imported", item, item.path, time.monotonic() - start))
    return True


def _import_error(result: RunResult, item: SquashItem, remote: Remote, errors: list[str]) -> ClusterError:
    code = result.returncode
    ours = [line.removeprefix(STATUS_PREFIX + "error: ") for line in errors if line.startswith(STATUS_PREFIX)]
    theirs = [line for line in errors if not line.startswith(STATUS_PREFIX)]
    where = remote.description
    if code == 10:
        return ClusterError(
            f"Cannot write the .sqsh cache on {where}: {'; '.join(ours)}.",
            hint="Set remote_job_dir in the env.toml profile to a directory you can write on the cluster.",
        )
    if code == 11:
        return ClusterError(
            f"Cannot take the import lock on {where}: {'; '.join(ours)}.",
            hint="The filesystem under remote_job_dir must support flock (e.g. Lustre mounted with -o flock).",
        )
    if code == 13:
        return ClusterError(
            f"enroot import of {item.image} on {where} did not produce a squashfs image: {'; '.join(ours)}.",
            hint="Run `enroot import` by hand on a compute node to see why.",
        )
    if code == 14:
        return ClusterError(
            f"Cannot import {item.image} on {where}: {'; '.join(ours)}",
            hint="Squashing runs enroot through srun; use a profile whose host is a Slurm login node.",
        )
    if code == 15:
        return ClusterError(f"The import of {item.image} on {where} was interrupted.", hint="Run the command again.")
    if code == 127:
        return ClusterError(
            f"Cannot run the import on {where}: {result.stderr.strip()[-300:]}",
            hint="The login node needs bash, flock (util-linux) and Slurm's srun.",
        )
    # enroot's own words: everything but its progress lines
    shown = [line for line in theirs if line.strip() and not line.startswith(("[INFO]", "[WARN]"))]
    detail = "\n".join(shown[-8:]) or result.stderr.strip()[-1000:]
    text = "\n".join(theirs)
    if "404" in text or "manifest unknown" in text.lower():
        hint = (
            "Check the image name and tag; for a private registry put its credentials in "
            "~/.config/enroot/.credentials on the cluster."
        )
    elif "No space left" in text:
        hint = f"Free space under {posixpath.dirname(item.path)} (and enroot's cache next to it), then run again."
    elif "srun:" in text:
        hint = "Slurm refused the build step: check account, build_partition and build_time in the profile."
    else:
        hint = "Nothing was left behind; fix the cause above and run again (or try `enroot import` by hand)."
    return ClusterError(f"enroot import of {item.image} failed on {where}:\n{detail}", hint=hint)


def ensure_squashed(
    images: Sequence[ImageRef],
    profile: Profile,
    *,
    remote: Remote,
    force: bool = False,
    on_event: EventCallback | None = None,
) -> SquashResult:
    """Make sure every image has its .sqsh on the cluster: one check round trip, then the imports."""
    start = time.monotonic()
    emit = on_event or (lambda _e: None)
    plan = plan_squash(images, profile, check=True, remote=remote, force=force)
    emit(SquashEvent("checked"))
    imported: list[str] = []
    durations: dict[str, float] = {}
    for item in plan.items:
        if not force and item.status == "present":
            emit(SquashEvent("hit", item))
            continue
        t0 = time.monotonic()
        if import_image(remote, item, plan, force=force, on_event=on_event):
            imported.append(item.image)
            durations[item.image] = time.monotonic() - t0
    return SquashResult(plan=plan, imported=tuple(imported), seconds=time.monotonic() - start, import_seconds=durations)
