"""Which datasets `evaluate data fetch|push -c CONFIG -t TASK` mean: those of the config's tasks."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from collections.abc import Sequence
from pathlib import Path

from ckpteval.errors import ConfigError
from ckpteval.tasks.catalog import load_catalog
from ckpteval.tasks.data_status import CARRIES_ITS_DATA, OWN_DATA
from ckpteval.tasks.datasets import LM_EVAL_HARNESS, DatasetRef, task_data
from ckpteval.tasks.offline_data import offline_source_key


def datasets_of(
    configs: Sequence[str], tasks: Sequence[str], *, env_file: Path | None = None
) -> tuple[list[DatasetRef], list[str]]:
    """The datasets of the tasks that `-c configs -t tasks` select, and a note per task they are not known for."""
    from ckpteval.config.compose import CompileRequest, task_names

    if not configs and not tasks:
        raise ConfigError("Name the tasks whose datasets to use.", hint="Pass -c CONFIG and/or -t TASK.")
    catalog = load_catalog()
    names = task_names(CompileRequest(configs=tuple(configs), tasks=tuple(tasks), env_file=env_file), catalog=catalog)
    refs: list[DatasetRef] = []
    notes: list[str] = []
    for name in names:
        spec = catalog.get(name)
        data = task_data(spec)
        if spec.harness in CARRIES_ITS_DATA:
            notes.append(f"{name}: nothing to fetch: {CARRIES_ITS_DATA[spec.harness]}")
            continue
        if data.datasets is None:
            packaged = " (it has packaged offline data)" if offline_source_key(spec) else ""
            why = OWN_DATA if spec.harness != LM_EVAL_HARNESS else data.unknown
            notes.append(f"{name}: datasets not known to ckpteval{packaged}: {why}")
            continue
        refs.extend(data.datasets)
    return list(dict.fromkeys(refs)), notes
