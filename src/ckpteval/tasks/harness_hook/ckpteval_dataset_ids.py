"""Canonical ids of the Hugging Face datasets that lm-eval's task YAMLs still name without an owner.

The hub moved its old owner-less datasets (`hellaswag`, `winogrande`, ...) into their owners' namespaces
and answers the old id with the new one (`/api/datasets/<old id>` says `"id": "<owner>/<name>"`, its file
URLs redirect). The `datasets` and `huggingface_hub` releases ckpteval locks refuse an id without a
namespace before asking the hub ("Repository id must be 'namespace/name'"), and nvidia-lm-eval 26.3's task
YAMLs still use the old ids, so those tasks could neither be fetched nor run. Upstream lm-eval renamed
them in its task YAMLs (the release in `upstream`); this table does the same at one seam, for
`evaluate data fetch`, for staging, and inside the job (the harness hook rewrites `load_dataset`'s path).

Same repository, same files, same revision: only the id changes, so a task scores the same data it
did under the old id. A revision a task pins is kept as it is (a commit of the repository; the rename
did not change its history).

Self-contained (standard library only): it runs inside the harness process through the hook
directory, and ckpteval imports it too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CanonicalId:
    """Where an owner-less dataset id moved, and where that mapping comes from."""

    legacy: str
    canonical: str
    upstream: str  # the upstream lm-eval release (and change) whose task YAML names `canonical`
    note: str = ""


# Every owner-less `dataset_path` among the lm-eval tasks of the catalog (a unit test keeps it complete).
# `canonical` is what the hub answers for the old id (its redirect); `upstream` where lm-eval renamed it.
CANONICAL_IDS: dict[str, CanonicalId] = {
    c.legacy: c
    for c in (
        CanonicalId("hellaswag", "Rowan/hellaswag", "lm-eval 0.4.9.1 (#3172)"),
        CanonicalId("winogrande", "allenai/winogrande", "lm-eval 0.4.10 (#3525)"),
        CanonicalId("openbookqa", "allenai/openbookqa", "lm-eval 0.4.10 (#3527)"),
        CanonicalId("gsm8k", "openai/gsm8k", "lm-eval 0.4.10 (#3525)"),
        CanonicalId("truthful_qa", "truthfulqa/truthful_qa", "lm-eval 0.4.10 (#3527; truthfulqa_gen: #3723)"),
        CanonicalId(
            "mbpp",
            "google-research-datasets/mbpp",
            "lm-eval 0.4.8 (#2247: its own mbpp task; nvidia-lm-eval's adlr_mbpp tasks keep the old id)",
        ),
        CanonicalId(
            "social_i_qa",
            "allenai/social_i_qa",
            "lm-eval 0.4.10 (#3527)",
            note="the repository holds a loading script only, which datasets no longer runs; upstream lm-eval "
            "moved on to the parquet mirror lighteval/siqa (#3943, unreleased)",
        ),
    )
}


def canonical_id(path: str) -> str:
    """The id to load `path` by: its owner's repository for an owner-less legacy id, else `path` itself."""
    entry = CANONICAL_IDS.get(path)
    return entry.canonical if entry else path


def legacy_ids(path: str) -> tuple[str, ...]:
    """The owner-less ids that `canonical_id` turns into `path` (none for most datasets)."""
    return tuple(c.legacy for c in CANONICAL_IDS.values() if c.canonical == path)
