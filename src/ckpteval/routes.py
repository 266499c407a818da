"""The OpenAI-compatible routes a deployment serves (the builtin server, Export-Deploy, vLLM) and tasks use.

Defined once here: the builtin server routes requests by them, the job waits on `HEALTH`, task clients
post to `COMPLETIONS` or `CHAT`, and the eval delegate builds its URLs from them. (The packaged
`conf/deployment/*.yaml` spell them as config values a user may override per deployment.)
"""

from __future__ import annotations

from typing import Final

COMPLETIONS: Final = "/v1/completions"
CHAT: Final = "/v1/chat/completions"
MODELS: Final = "/v1/models"
HEALTH: Final = "/v1/health"
STATS: Final = "/v1/stats"  # the builtin server's counters (tests and benchmarks read them)

# endpoint type (target.api_endpoint.type, a task's endpoint_type) -> its route
BY_ENDPOINT_TYPE: Final = {"completions": COMPLETIONS, "chat": CHAT}
