"""Developer sessions: `uv run nox -s tests`, `-s lint`, `-s typecheck`, `-s startup_benchmark`.

Sessions reuse the project's uv environment (the stack is 6 GB; one venv is enough).
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "typecheck", "tests"]


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite (unit, integration against the local Slurm + sshd, e2e with the real model)."""
    session.run("pytest", *session.posargs, external=True)


@nox.session
def unit(session: nox.Session) -> None:
    """Fast tests only (no Slurm, no model)."""
    session.run("pytest", "tests/unit", *session.posargs, external=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check + format check."""
    session.run("ruff", "check", "src", "tests", "benchmarks", external=True)
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", external=True)


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the package."""
    session.run("mypy", "src/ckpteval", external=True)


@nox.session
def startup_benchmark(session: nox.Session) -> None:
    """Measure `evaluate --help` and `--dry-run` against their baselines (benchmarks/startup.py)."""
    session.run("python", "benchmarks/startup.py", *session.posargs, external=True)
