"""Let megatron-core 0.16.1 run on a machine without a GPU.

megatron-core assumes CUDA in a handful of places that the local (non-Transformer-Engine) layer
spec reaches. Each patch below replaces one of those assumptions with its CPU equivalent; the
numbers are the rows of the table in the project's megatron-cpu notes. Apply them once, before the
first forward pass, and only when the model runs on the CPU: on a GPU nothing here is needed.

Row 4 (psutil) and row 8 (tqdm) are dependencies, not patches: without psutil
`dist_checkpointing.save` waits forever for a writer process that has died.
"""

from __future__ import annotations

import time
from typing import Any

_applied = False


class _CpuEvent:
    """Stands in for `torch.cuda.Event` (row 6): timing events built on `perf_counter`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._t: float | None = None

    def record(self, *args: Any, **kwargs: Any) -> None:
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait(self, *args: Any, **kwargs: Any) -> None:
        pass

    def elapsed_time(self, end: _CpuEvent) -> float:
        assert self._t is not None and end._t is not None, "record() both events first"
        return (end._t - self._t) * 1e3


def apply_cpu_patches() -> None:
    """Patch torch/megatron so megatron-core's GPT model, checkpointing and inference run on the CPU.

    Idempotent. Call it only when the model runs on the CPU (see `server.runtime`): it makes
    `torch.cuda.current_device()` answer "cpu" for the whole process.
    """
    global _applied
    if _applied:
        return
    import torch

    # Row 2: RoPE, the attention score buffer and KV-cache allocation ask for the current CUDA device.
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    # Row 3: the torch_dist writer synchronises the device before copying tensors to write.
    torch.cuda.synchronize = lambda *a, **k: None
    # Row 5: megatron's text-generation controller moves tensors with `.cuda()`; on a CPU-only
    # machine that call could only fail, so keeping the tensor where it is changes nothing else.
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    # Row 6: the same controller times steps with CUDA events.
    torch.cuda.Event = _CpuEvent  # type: ignore[assignment,misc]

    # Row 7: the default causal mask is built with device="cuda" when no mask is passed.
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.transformer.utils as transformer_utils

    def causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    fused_softmax.get_default_causal_mask = causal_mask
    transformer_utils.get_default_causal_mask = causal_mask
    _applied = True


def initialize_rng_tracker() -> None:
    """Row 1: give megatron an RNG tracker without `model_parallel_cuda_manual_seed`.

    That function asserts CUDA. The inference tracker's `fork()` is a no-op, which is all that
    attention needs when dropout is off (it always is when serving). Works on GPU too.
    """
    from megatron.core.tensor_parallel.random import initialize_rng_tracker as _init

    _init(inference_rng_tracker=True, force_reset=True)


def allow_moe_without_transformer_engine() -> None:
    """megatron-core 0.16.1's MoE router reads `te_general_gemm`, which it defines only when Transformer
    Engine imports (`moe_utils.py`: the router's gating GEMM); without it every MoE forward raises
    NameError, on a GPU too. None selects the plain `torch.mm` path the same function takes for fp64."""
    import megatron.core.transformer.moe.moe_utils as moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
