"""The one place that decides how a job ended: from its exit code, or from Slurm's word for it.

States of an invocation (and of its job): pending, running, succeeded, failed, cancelled, unknown.
"""

from __future__ import annotations

from typing import Literal

State = Literal["pending", "running", "succeeded", "failed", "cancelled", "unknown"]
ENDED: tuple[State, ...] = ("succeeded", "failed", "cancelled")

# the job script's exit code after SIGINT (Ctrl-C) / SIGTERM (cancel, preemption, time limit): stopped, not failed
STOPPED_EXIT_CODES = (130, 143)

# Slurm's terminal states -> ours
SLURM_END_STATES: dict[str, State] = {
    "COMPLETED": "succeeded",
    "FAILED": "failed",
    "TIMEOUT": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed",
    "DEADLINE": "failed",
    "CANCELLED": "cancelled",
    "PREEMPTED": "cancelled",
    "REVOKED": "cancelled",
}


def end_state(exit_code: int | None, slurm_state: str | None = None) -> State | None:
    """How a job ended: Slurm's terminal state decides when Slurm knows one (a COMPLETED job whose script
    recorded a non-zero exit code failed); otherwise the exit code the job script recorded (0: succeeded,
    130/143, a signal: cancelled, else failed). None: neither says the job has ended."""
    ours = SLURM_END_STATES.get(slurm_state or "")
    if ours is not None:
        return "failed" if ours == "succeeded" and exit_code not in (None, 0) else ours
    if exit_code is None:
        return None
    if exit_code == 0:
        return "succeeded"
    return "cancelled" if exit_code in STOPPED_EXIT_CODES or exit_code < 0 else "failed"
