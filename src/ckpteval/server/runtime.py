"""One process, one device: the torch.distributed and megatron state a single-rank model needs.

megatron-core builds even an unsharded model through its model-parallel groups, so a server or a
converter first creates a world of size one. The rendezvous port is picked free so two servers (or
a server and a converter) on one machine never collide on a fixed MASTER_PORT.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import os
import socket
from dataclasses import dataclass
from typing import Any, Literal

from ckpteval.errors import DeploymentError

DeviceChoice = Literal["auto", "cpu", "cuda"]
DtypeChoice = Literal["auto", "float32", "bfloat16", "float16"]


@dataclass(frozen=True)
class Runtime:
    """Where the model runs: a torch device string ("cpu", "cuda:0") and its dtype name."""

    device: str
    dtype: str

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"


def quiet_library_logs() -> None:
    """Silence start-up chatter that says nothing to a user of a CPU server.

    torch warns that no CUDA runtime exists (on a CPU machine, expected) and megatron announces
    optional backends it did not find. Errors still show.
    """
    import logging
    import warnings

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    logging.getLogger("megatron").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module=r"megatron\..*")
    warnings.filterwarnings("ignore", message=r".*(Transformer Engine|Apex|apex).*")
    # torch.distributed.checkpoint warns about its own ShardedTensor use when megatron loads
    warnings.filterwarnings("ignore", message=r".*Please use DTensor instead.*")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def resolve_device(choice: str) -> str:
    """ "auto" -> "cuda:0" when a GPU is visible, else "cpu"; "cuda" without a GPU is an error."""
    import torch

    if choice == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if choice.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeploymentError(
                f"--device {choice} was asked for, but torch sees no GPU.",
                hint="Use --device cpu (or auto), or check CUDA_VISIBLE_DEVICES and the driver.",
            )
        return choice if ":" in choice else "cuda:0"
    if choice == "cpu":
        return "cpu"
    raise DeploymentError(f"Unknown device {choice!r}.", hint="Use auto, cpu, cuda or cuda:N.")


def resolve_dtype(choice: str, *, device: str, trained_in: str) -> str:
    """The dtype to serve in: float32 on the CPU (bf16 matmuls are slow there), else the training dtype."""
    if choice != "auto":
        if choice not in ("float32", "bfloat16", "float16"):
            raise DeploymentError(f"Unknown dtype {choice!r}.", hint="Use auto, float32, bfloat16 or float16.")
        return choice
    return "float32" if device == "cpu" else trained_in


def init_runtime(device: str = "auto", dtype: str = "auto", *, trained_in: str = "float32") -> Runtime:
    """Create the single-rank process group and megatron's parallel state (idempotent).

    On the CPU this also applies the CPU patches (`server.cpu`), before anything allocates.
    """
    import torch
    import torch.distributed as dist

    runtime = Runtime(device=resolve_device(device), dtype="float32")
    runtime = Runtime(device=runtime.device, dtype=resolve_dtype(dtype, device=runtime.device, trained_in=trained_in))

    from ckpteval.server.cpu import apply_cpu_patches, initialize_rng_tracker

    if runtime.on_cpu:
        apply_cpu_patches()
    else:
        torch.cuda.set_device(torch.device(runtime.device))
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
        # gloo even on a GPU: with one rank there is no communication, and gloo needs no NCCL setup.
        dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    initialize_rng_tracker()
    return runtime


def shutdown_runtime() -> None:
    """Tear down megatron's parallel state and the process group, if they exist."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def torch_dtype(name: str) -> Any:
    """The torch dtype object for a dtype name."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
