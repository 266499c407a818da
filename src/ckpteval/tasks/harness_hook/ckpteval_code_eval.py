"""A drop-in for Hugging Face `evaluate.load("code_eval")` that needs no hub and runs code sandboxed.

HumanEval-style tasks in nvidia-lm-eval call `evaluate.load("code_eval")` when their utils module
is imported and then `metric.compute(references=[...], predictions=[[...]], k=[1])`. The hub metric
is a script downloaded at run time (impossible offline) that `exec`s model output in forked
processes of the evaluator. This class keeps its interface and scoring rule (a candidate passes when
`candidate + "\\n" + test` runs to completion without raising within `timeout` seconds; pass@k with
the unbiased estimator of Chen et al. 2021) and runs every program through `ckpteval_sandbox`.
Like the hub metric it refuses to run unless `HF_ALLOW_CODE_EVAL=1` (ckpteval's job sets it).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

try:
    import ckpteval_sandbox  # as loaded by the hook (the hook dir is on sys.path)
except ImportError:  # imported as part of the ckpteval package
    from . import ckpteval_sandbox

_REFUSAL = (
    "ckpteval's code_eval executes model-generated code (sandboxed: own process, time, memory, no network, "
    "read-only file system). Set HF_ALLOW_CODE_EVAL=1 to allow it (ckpteval's job sets it for you)."
)


def estimate_pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with `n` samples of which `c` are correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


class SandboxedCodeEval:
    """The object `evaluate.load("code_eval")` returns, with `compute` running code in the sandbox."""

    name = "code_eval"

    def compute(
        self,
        *,
        predictions: list[list[str]],
        references: list[str],
        k: list[int] | tuple[int, ...] = (1, 10, 100),
        num_workers: int = 4,
        timeout: float = ckpteval_sandbox.DEFAULT_TIMEOUT_S,
    ) -> tuple[dict[str, float], dict[int, list[tuple[int, dict[str, Any]]]]]:
        """Score each problem's candidates against its test; returns (pass@k, per-candidate results)."""
        if os.environ.get("HF_ALLOW_CODE_EVAL", "0") != "1":
            raise ValueError(_REFUSAL)
        jobs = [
            (task_id, completion_id, candidate + "\n" + test)
            for task_id, (candidates, test) in enumerate(zip(predictions, references, strict=True))
            for completion_id, candidate in enumerate(candidates)
        ]
        results: dict[int, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
        workers = max(1, min(num_workers, len(jobs), os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            outcomes = pool.map(lambda job: ckpteval_sandbox.run_program(job[2], timeout=timeout), jobs)
            for (task_id, completion_id, _), outcome in zip(jobs, outcomes, strict=True):
                results[task_id].append(
                    (
                        completion_id,
                        {
                            "task_id": task_id,
                            "passed": outcome.passed,
                            "result": outcome.result,
                            "completion_id": completion_id,
                        },
                    )
                )
        totals = [len(r) for r in results.values()]
        corrects = [sum(1 for _, res in r if res["passed"]) for r in results.values()]
        pass_at_k = {
            f"pass@{kk}": sum(estimate_pass_at_k(n, c, kk) for n, c in zip(totals, corrects, strict=True)) / len(totals)
            for kk in k
            if totals and all(n >= kk for n in totals)
        }
        return pass_at_k, dict(results)
