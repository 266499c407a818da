"""An evaluation service that RL training loops delegate to (slime's eval delegate / skills-server protocol).

`evaluate serve-delegate` runs `server.serve`; `protocol` validates requests and shapes metrics;
`service.Delegate` turns one request into one local `evaluate` invocation against the training loop's
router (`deployment: none`). See docs/repeats-and-delegate.md.
"""

from __future__ import annotations

from ckpteval.delegate.protocol import EvalRequest, RequestError, parse_request
from ckpteval.delegate.service import Delegate, DelegateSettings, EvaluationFailed

__all__ = ["Delegate", "DelegateSettings", "EvalRequest", "EvaluationFailed", "RequestError", "parse_request"]
