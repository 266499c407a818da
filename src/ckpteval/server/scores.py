"""What scoring a sequence gives: one row of log-probabilities (the engine's and the prefix scorer's answer)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ScoredRow:
    """Log-probabilities of one scored sequence of n tokens.

    token_logprobs[i] is log p(token[i+1] | tokens[:i+1]) (n-1 values); top_ids[i] / top_logprobs[i]
    are the k most likely next tokens after position i (n positions, the last one predicts the
    token after the sequence).
    """

    token_logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
