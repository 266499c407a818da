"""The task -> datasets mapping, checked against lm-eval's own task registry (`TaskManager`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckpteval.tasks.catalog import load_catalog
from ckpteval.tasks.datasets import DatasetRef, TaskDefinitionError, lm_eval_datasets, task_data
from ckpteval.tasks.harness_hook.ckpteval_dataset_ids import canonical_id

# a plain task, one with `include`, one with a config name, a group of tags (57 subtasks), a tag whose
# tasks inherit it from an included file, the pretrain config's others
REGISTRY_CASES = [
    "piqa",
    "adlr_arc_challenge_llama",
    "winogrande",
    "mmlu_str",
    "mgsm_direct",
    "hellaswag",
    "openbookqa",
]


def _leaves(tm: Any, name: str) -> list[str]:
    """lm-eval's own answer: the leaf tasks a task, group or tag name expands to."""
    info = tm.task_index[name]
    if info["type"] == "task":
        return [name]
    if info["type"] == "tag":
        return [leaf for sub in info["task"] for leaf in _leaves(tm, sub)]
    subtasks = tm._get_config(name)["task"]
    return [leaf for sub in subtasks for leaf in _leaves(tm, sub if isinstance(sub, str) else sub["task"])]


def _expected(tm: Any, name: str) -> set[tuple[str, str | None, str | None, tuple[str, ...]]]:
    out = set()
    for leaf in _leaves(tm, name):
        cfg = tm._get_config(leaf)
        splits = tuple(
            sorted(
                {
                    str(cfg[k])
                    for k in ("training_split", "validation_split", "test_split", "fewshot_split")
                    if cfg.get(k)
                }
            )
        )
        revision = (cfg.get("dataset_kwargs") or {}).get("revision")
        # lm-eval's id, under its canonical name (an owner-less legacy id moved to its owner's repository)
        out.add((canonical_id(cfg["dataset_path"]), cfg.get("dataset_name"), revision, splits))
    return out


@pytest.fixture(scope="module")
def task_manager() -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager()


@pytest.mark.slow
@pytest.mark.parametrize("name", REGISTRY_CASES)
def test_datasets_match_lm_evals_registry(task_manager: Any, name: str) -> None:
    ours = lm_eval_datasets(name)
    expected = _expected(task_manager, name)
    # lm-eval gives the splits per leaf task; ours merges the leaves that load the same (path, name, revision)
    merged: dict[tuple[str, str | None, str | None], set[str]] = {}
    for path, config, revision, splits in expected:
        merged.setdefault((path, config, revision), set()).update(splits)
    assert {(r.path, r.name, r.revision): set(r.splits) for r in ours} == merged
    assert len(ours) == len(merged)


def _write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


def test_a_group_with_inline_configs_includes_and_revisions(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "fam/_base_yaml",
        "dataset_path: org/base\ntest_split: test\nfewshot_split: dev\noutput_type: multiple_choice\n",
    )
    _write(
        tmp_path,
        "fam/a.yaml",
        "include: _base_yaml\ntask: fam_a\ndataset_name: a\ndataset_kwargs:\n  revision: abc123\n",
    )
    _write(tmp_path, "fam/b.yaml", '"include": "_base_yaml"\n"task": "fam_b"\n"tag": "fam_tag"\n"dataset_name": "b"\n')
    _write(
        tmp_path,
        "fam/group.yaml",
        "group: fam\ntask:\n  - fam_a\n  - fam_tag\n"
        "  - task: fam_c\n    dataset_path: org/inline\n    test_split: eval\n"
        "doc_to_text: !function utils.doc_to_text\n",
    )
    refs = lm_eval_datasets("fam", root=tmp_path)
    assert refs == (
        DatasetRef("org/base", "a", "abc123", ("dev", "test")),
        DatasetRef("org/base", "b", None, ("dev", "test")),
        DatasetRef("org/inline", None, None, ("eval",)),
    )
    with pytest.raises(TaskDefinitionError, match="no task, group or tag named 'nosuch'"):
        lm_eval_datasets("nosuch", root=tmp_path)


def test_every_lm_eval_task_of_the_catalog_has_known_datasets() -> None:
    catalog = load_catalog()
    lm_eval = [spec for spec in catalog.tasks if spec.harness == "lm-evaluation-harness"]
    unknown = {spec.name: task_data(spec).unknown for spec in lm_eval if task_data(spec).datasets is None}
    assert unknown == {}
    pretrain = {n: task_data(catalog.get(n)).datasets for n in ("piqa", "adlr_arc_challenge_llama_25_shot")}
    assert pretrain["piqa"] == (DatasetRef("baber/piqa", None, None, ("train", "validation")),)
    assert pretrain["adlr_arc_challenge_llama_25_shot"] == (
        DatasetRef("allenai/ai2_arc", "ARC-Challenge", None, ("test", "train", "validation")),
    )
    assert len(task_data(catalog.get("adlr_mmlu")).datasets or ()) == 57  # mmlu_str: one config per subject
    other = next(spec for spec in catalog.tasks if spec.harness == "simple_evals")
    assert task_data(other).datasets is None and "not read by ckpteval" in task_data(other).unknown
