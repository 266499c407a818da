"""Checks on the cluster before anything is submitted, so a job does not fail in the queue for a reason
one round trip could have told.

`check_builtin_python`: a builtin deployment outside a container runs `<profile python> -m ckpteval.server`
on the compute node; if that Python cannot import ckpteval the job would start, wait for its turn, and die
with "No module named ckpteval". The login node shares the compute nodes' filesystem, so asking it once
tells the user before the job is queued.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from ckpteval.errors import ConfigError

if TYPE_CHECKING:
    from ckpteval.cluster.remote import Remote
    from ckpteval.config.profiles import Profile
    from ckpteval.job.plan import JobPlan

BUILTIN_KIND = "megatron/builtin"
# One answer per (cluster, python) for the life of this process: one invocation asks once.
_answers: dict[tuple[str, str], str | None] = {}
_PROBE = "import ckpteval, sys; sys.stdout.write(ckpteval.__file__)"


def needs_cluster_python(plan: JobPlan) -> bool:
    """Whether the job runs ckpteval with the profile's Python on a bare node (no image): its own server, or the
    export step of vLLM/SGLang on a Megatron checkpoint."""
    step = plan.deployment.step
    export = plan.deployment.export_step
    builtin = plan.deployment.kind == BUILTIN_KIND and step is not None and not step.image
    return builtin or (export is not None and not export.image)


def import_problem(remote: Remote, python: str) -> str | None:
    """None when `python` on the cluster imports ckpteval, else what went wrong (its last line of stderr).

    One round trip on `remote`; the answer is kept for the rest of this invocation."""
    key = (remote.description, python)
    if key not in _answers:
        result = remote.run([python, "-c", _PROBE], check=False, timeout=60)
        if result.ok:
            _answers[key] = None
        else:
            lines = [ln.strip() for ln in (result.stderr or result.stdout).splitlines() if ln.strip()]
            _answers[key] = lines[-1] if lines else f"exit status {result.returncode}"
    return _answers[key]


def check_builtin_python(remote: Remote, plan: JobPlan, profile: Profile) -> None:
    """Raise ConfigError, before submission, when the job's builtin deployment would run a Python on the
    cluster that cannot import ckpteval. Jobs that deploy otherwise (or in a container) are not asked about."""
    if not needs_cluster_python(plan):
        return
    python = profile.part.step_python()
    problem = import_problem(remote, python)
    if problem is None:
        return
    raise ConfigError(
        f"Profile [{profile.name}]: python = {shlex.quote(python)} cannot import ckpteval on "
        f"{remote.description} ({problem}), and the job runs ckpteval with it (the builtin deployment, or the "
        "export step of vLLM/SGLang).",
        hint="Install ckpteval for that Python on the cluster, or set python in the profile to one that has it "
        '(python = "/path/to/venv/bin/python"), or run the deployment in an image with ckpteval '
        "(deployment.image=...).",
    )


def forget_answers() -> None:
    """Drop the kept answers (a long-lived process that changes the cluster between invocations; tests)."""
    _answers.clear()
