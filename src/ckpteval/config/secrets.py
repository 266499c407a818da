"""Secret values, and redaction by value.

A value is secret because of where it came from, not because of the name of the key holding it:
a `${secret:NAME}` interpolation, an environment variable known to hold a credential, or the
W&B key found in the user's login. Every such value is collected in a `SecretValues`, and every
string we print or save goes through `redact`, which replaces each occurrence of a secret value.
Keys like `tokenizer` stay visible; a key that happens to contain "key" but holds a path stays too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

REDACTED = "********"

# Environment variables that hold credentials by convention. Their *values* are secret wherever
# they end up (an env var mapping, an interpolation, a log line).
CREDENTIAL_ENV_VARS = (
    "WANDB_API_KEY",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "NGC_API_KEY",
    "NVIDIA_API_KEY",
    "OPENAI_API_KEY",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_PASSWORD",
)

# Values too short to redact safely ("1", "true"): replacing them would mangle unrelated text and
# no real credential is this short.
_MIN_SECRET_LEN = 6


@dataclass
class SecretValues:
    """The secret values known to this invocation."""

    _values: set[str] = field(default_factory=set)

    def add(self, value: str | None) -> None:
        """Remember `value` as secret (ignored when empty or too short to be a credential)."""
        if value and len(value) >= _MIN_SECRET_LEN:
            self._values.add(value)

    def add_env(self, names: Iterable[str], environ: dict[str, str] | None = None) -> None:
        """Remember the values of these environment variables, where set."""
        env = os.environ if environ is None else environ
        for name in names:
            self.add(env.get(name))

    def __contains__(self, value: object) -> bool:
        return value in self._values

    def __len__(self) -> int:
        return len(self._values)

    def redact(self, text: str) -> str:
        """`text` with every secret value replaced (longest first, so overlapping secrets all go)."""
        for value in sorted(self._values, key=len, reverse=True):
            text = text.replace(value, REDACTED)
        return text

    def redact_data(self, data: Any) -> Any:
        """A copy of nested dicts/lists with every string redacted."""
        if isinstance(data, str):
            return self.redact(data)
        if isinstance(data, dict):
            return {k: self.redact_data(v) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            return [self.redact_data(v) for v in data]
        return data


def collect_environment_secrets(environ: dict[str, str] | None = None) -> SecretValues:
    """A SecretValues holding the credential environment variables that are set."""
    secrets = SecretValues()
    secrets.add_env(CREDENTIAL_ENV_VARS, environ)
    return secrets
