"""One mapping from how a job ended (exit code, signal, Slurm state) to an invocation's state."""

from __future__ import annotations

import pytest

from ckpteval.execution.state import end_state


@pytest.mark.parametrize(
    ("exit_code", "slurm", "expected"),
    [
        (None, None, None),  # nothing says it ended
        (0, None, "succeeded"),
        (1, None, "failed"),
        (3, None, "failed"),  # the deployment never became healthy
        (130, None, "cancelled"),  # Ctrl-C
        (143, None, "cancelled"),  # SIGTERM: cancel, preemption, time limit
        (-15, None, "cancelled"),  # killed by a signal before the script could record its code
        (None, "COMPLETED", "succeeded"),
        (1, "COMPLETED", "failed"),  # Slurm completed the step, a task failed
        (0, "TIMEOUT", "failed"),
        (None, "PREEMPTED", "cancelled"),
        (143, "CANCELLED", "cancelled"),
        (0, "RUNNING", "succeeded"),  # not a terminal Slurm state: the job's own code decides
    ],
)
def test_end_state(exit_code: int | None, slurm: str | None, expected: str | None):
    assert end_state(exit_code, slurm) == expected
