"""A deployment's identity: the token a job gives the server it starts, so that "something answers on this
port" becomes "*our* deployment answers on this port".

The job makes one per deployment (`new_identity`: the invocation id plus a random part; not a secret, only
unguessable by accident); the builtin server reports it under `deployment` in `/v1/health` and in each
`/v1/models` entry, with what it loaded under `checkpoint` (`ckpteval.server.loaded`). The job's health wait
and every task client compare it before their first request (`ckpteval.job.script`, the harness hook's
`ckpteval_wait_ready`), and a mismatch stops them at once.

Every response also names both in its headers (`DEPLOYMENT_HEADER`, `CHECKPOINT_HEADER`: the loaded
checkpoint's content sha256), and the harness hook checks them on every answer (`ckpteval_responses`): a
server replaced mid-task (another with the same served name took the port) fails the task, naming it.
"""

from __future__ import annotations

import secrets
from typing import Any

IDENTITY_KEY = "deployment"
CHECKPOINT_KEY = "checkpoint"
# the harness hook spells these too (it imports nothing from ckpteval): `ckpteval_responses`
DEPLOYMENT_HEADER = "x-ckpteval-deployment"
CHECKPOINT_HEADER = "x-ckpteval-checkpoint"


def new_identity(invocation: str) -> str:
    """A fresh identity for the deployment of `invocation`."""
    return f"{invocation}-{secrets.token_hex(6)}"


def identity_payload(identity: str | None, checkpoint: dict[str, Any] | None = None) -> dict[str, Any]:
    """What /v1/health and /v1/models add to say which deployment answers (nothing without an identity),
    and what it loaded (`LoadedReport.to_json`)."""
    out: dict[str, Any] = {IDENTITY_KEY: identity} if identity else {}
    if checkpoint:
        out[CHECKPOINT_KEY] = checkpoint
    return out


def identity_headers(identity: str | None, checkpoint_sha256: str | None) -> list[tuple[bytes, bytes]]:
    """The headers every response carries: the deployment's token and the loaded checkpoint's content sha256."""
    out = []
    if identity:
        out.append((DEPLOYMENT_HEADER.encode(), identity.encode()))
    if checkpoint_sha256:
        out.append((CHECKPOINT_HEADER.encode(), checkpoint_sha256.encode()))
    return out
