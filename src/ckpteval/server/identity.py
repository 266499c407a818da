"""A deployment's identity: the token a job gives the server it starts, so that "something answers on this
port" becomes "*our* deployment answers on this port".

The job makes one per deployment (`new_identity`: the invocation id plus a random part; not a secret, only
unguessable by accident); the builtin server reports it under `deployment` in `/v1/health` and in each
`/v1/models` entry. The job's health wait and every task client compare it before their first request
(`ckpteval.job.script`, the harness hook's `ckpteval_wait_ready`), and a mismatch stops them at once.
"""

from __future__ import annotations

import secrets

IDENTITY_KEY = "deployment"


def new_identity(invocation: str) -> str:
    """A fresh identity for the deployment of `invocation`."""
    return f"{invocation}-{secrets.token_hex(6)}"


def identity_payload(identity: str | None) -> dict[str, str]:
    """What /v1/health and /v1/models add to say which deployment answers (nothing without an identity)."""
    return {IDENTITY_KEY: identity} if identity else {}
