"""The W&B key: found where the user's `wandb login` put it, and carried to a cluster job in a file.

Lookup order (`find_wandb_key`): `$WANDB_API_KEY`, then wandb's own readers of the login —
`~/.netrc` (or `$NETRC`) for the W&B host, then wandb's settings files. The key is only ever
returned inside a `WandbKey`, whose repr hides the value; nothing here prints or logs it, and
`os.environ` is never changed: callers hand the key to wandb through `wandb.Settings(api_key=...)`.

A detached cluster job cannot ask the user's laptop for the key, so submission writes it to
`<job_dir>/.secrets/wandb_api_key` through the Remote seam (SFTP, never a command line): the
directory is 0700 and the file 0600, owned by the job's user. The job's export step reads it back
with `read_key_file`, which refuses a file that others could read.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ckpteval.errors import ExportError
from ckpteval.notices import notice

if TYPE_CHECKING:
    from collections.abc import Callable

    from ckpteval.cluster.remote import Remote
    from ckpteval.config.secrets import SecretValues

KEY_ENV_VAR = "WANDB_API_KEY"
SECRETS_DIR = ".secrets"
KEY_FILE_NAME = "wandb_api_key"
LOGIN_HINT_SHORT = "Log in with `wandb login` (or export WANDB_API_KEY=...)"
LOGIN_HINT = LOGIN_HINT_SHORT + ", or set WANDB_MODE=offline to write the run locally and `wandb sync` it later."

WandbMode = Literal["online", "offline", "disabled"]


@dataclass(frozen=True)
class WandbKey:
    """A W&B API key and where it came from. The value never appears in repr or str."""

    value: str = field(repr=False)
    origin: Literal["env", "login", "file"]
    source: str  # for messages: "WANDB_API_KEY", "/home/me/.netrc", "wandb settings", a key file's path

    def __str__(self) -> str:
        return f"W&B key from {self.source}"


def wandb_mode(environ: Mapping[str, str] | None = None) -> WandbMode:
    """online | offline | disabled, from `$WANDB_MODE` (wandb's own spellings: dryrun is offline)."""
    env = os.environ if environ is None else environ
    mode = (env.get("WANDB_MODE") or "online").strip().lower()
    if mode in ("offline", "dryrun"):
        return "offline"
    if mode == "disabled":
        return "disabled"
    return "online"


def wandb_base_url(environ: Mapping[str, str] | None = None) -> str | None:
    """`$WANDB_BASE_URL` when set (a self-hosted server), else None (wandb's default host)."""
    env = os.environ if environ is None else environ
    return env.get("WANDB_BASE_URL") or None


def find_wandb_key(environ: Mapping[str, str] | None = None) -> WandbKey | None:
    """The W&B key to use: `$WANDB_API_KEY`, else the one `wandb login` saved; None when there is none.

    Reading the login imports wandb (about 2 s), so this is called only when W&B is really needed.
    """
    env = os.environ if environ is None else environ
    explicit = (env.get(KEY_ENV_VAR) or "").strip()
    if explicit:
        return WandbKey(value=explicit, origin="env", source=KEY_ENV_VAR)
    return _login_key(wandb_base_url(env), _settings_file(env))


def _settings_file(env: Mapping[str, str]) -> str:
    """wandb's user settings file: `$WANDB_CONFIG_DIR/settings`, else `~/.config/wandb/settings`."""
    config_dir = env.get("WANDB_CONFIG_DIR")
    return str(Path(config_dir).expanduser() / "settings" if config_dir else Path.home() / ".config/wandb/settings")


def _login_key(base_url: str | None, settings_file: str) -> WandbKey | None:
    """The key `wandb login` stored for `base_url` (netrc first, then wandb's settings file)."""
    from wandb import Settings
    from wandb.errors import AuthenticationError
    from wandb.sdk.lib.wbauth import HostUrl, wbnetrc

    # fresh settings read from the file now (wandb's process-wide singleton caches them)
    settings = Settings(silent=True, settings_system=settings_file)
    settings.update_from_system_settings()
    host = HostUrl(base_url or settings.base_url)
    try:
        found = wbnetrc.read_netrc_auth_with_source(host=host)
    except AuthenticationError as exc:  # an entry exists but does not hold a valid key
        raise ExportError(
            f"The W&B key in your netrc is not valid: {exc}", hint="Run `wandb login --relogin`."
        ) from None
    if found is not None:
        key = getattr(found.auth, "api_key", None)
        if key:
            return WandbKey(value=key, origin="login", source=found.source)
    if settings.api_key and host.is_same_url(settings.base_url):
        return WandbKey(value=settings.api_key, origin="login", source="wandb settings")
    return None


_announced: set[str] = set()


def announce_login(key: WandbKey) -> None:
    """Say once per process (a notice the front end shows) that the key of the user's `wandb login` is used
    (never the key)."""
    if key.origin != "login" or key.source in _announced:
        return
    _announced.add(key.source)
    notice.info("Detected W&B login (%s)", key.source)


def key_file_path(job_dir: str) -> str:
    """Where a job finds its W&B key: `<job_dir>/.secrets/wandb_api_key` (a POSIX path on the cluster)."""
    return posixpath.join(job_dir, SECRETS_DIR, KEY_FILE_NAME)


def write_key_file(remote: Remote, job_dir: str, key: WandbKey) -> str:
    """Write the key where the job reads it, readable only by its owner; returns the file's path.

    The directory is created (or tightened) to 0700 before the file is written, so the file is never
    reachable by others, not even for the moment between its creation and its chmod to 0600. The
    text travels over SFTP (`Remote.write_text_atomic`), never on a command line.
    """
    return write_secret_file(remote, key_file_path(job_dir), key.value)


def write_secret_file(remote: Remote, path: str, value: str) -> str:
    """Write `value` to `path` (in the job's `.secrets/`), readable only by its owner (see `write_key_file`)."""
    directory = posixpath.dirname(path)
    remote.run(["mkdir", "-p", "-m", "700", directory])
    remote.run(["chmod", "700", directory])  # mkdir -m does not change a directory that existed
    remote.write_text_atomic(path, value + "\n", mode=0o600)
    return path


def read_key_file(path: str | Path) -> WandbKey:
    """The key a job was given (see `write_key_file`). Raises ExportError if the file is missing, empty,
    not ours, or readable by anyone else (then the key may have leaked: we do not use it)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ExportError(
            f"The W&B key file {path} does not exist.",
            hint="It is written at submission when a W&B key is found; " + LOGIN_HINT,
        ) from None
    except OSError as exc:
        raise ExportError(f"Cannot open the W&B key file {path}: {exc.strerror}.") from None
    with os.fdopen(fd, "r", encoding="utf-8") as fh:
        info = os.fstat(fh.fileno())
        if info.st_uid != os.getuid():
            raise ExportError(f"The W&B key file {path} belongs to another user; not using it.")
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise ExportError(
                f"The W&B key file {path} is readable by others (mode {stat.S_IMODE(info.st_mode):o}); not using it.",
                hint=f"Remove it, rotate the key at https://wandb.ai/authorize, and resubmit (or chmod 600 {path}).",
            )
        value = fh.read().strip()
    if not value:
        raise ExportError(f"The W&B key file {path} is empty.")
    return WandbKey(value=value, origin="file", source=str(path))


def stage_wandb_key(
    remote: Remote,
    job_dir: str,
    *,
    secrets: SecretValues | None = None,
    environ: Mapping[str, str] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> str | None:
    """Give the job the user's W&B key; returns the key file's path, or None when there is no key to give
    (WANDB_MODE offline/disabled: none is needed; not logged in: `on_note` gets one line on how to log in).

    The key joins `secrets`, so anything rendered later is redacted even if the key came from the login.
    """
    env = os.environ if environ is None else environ
    if wandb_mode(env) != "online":
        return None
    key = find_wandb_key(env)
    if key is None:
        if on_note is not None:
            on_note(f"W&B export will be skipped: no W&B login found. {LOGIN_HINT}")
        return None
    announce_login(key)
    if secrets is not None:
        secrets.add(key.value)
    return write_key_file(remote, job_dir, key)
