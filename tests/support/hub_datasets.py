"""Small copies of the `pretrain`, `sft` and `rl` configs' datasets, in their hub repositories' real layout,
for the hub stand-in.

Each repository gets what the hub has: a README.md whose YAML header lists the configs and their data
files, and one parquet file per config and split, with the real column names and types (`ROWS` rows each:
enough for a task run with a small limit and its few-shot pool, 25-shot ARC included, not the real items;
short texts, so that a few-shot prompt fits the tiny test model's 2,048-byte context). MMLU has one config
per subject (lm-eval's `mmlu_str` group loads all 57), ARC and OpenBookQA have a config per variant,
HellaSwag, PIQA, MMLU-Pro and HumanEval one, GSM8K its `main`.
Also two repositories that cannot be fetched the usual way: one that is a loading script only (remote code)
and one the stand-in serves as gated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpteval.tasks.harness_hook.ckpteval_dataset_ids import CANONICAL_IDS

ROWS = 30  # ARC's 25-shot pool is its train split
REMOTE_CODE_REPO = "ckpteval-test/scripted"
GATED_REPO = "ckpteval-test/gated"
# lm-eval names some datasets by their legacy ids; the hub redirects those to the owner's repository
ALIASES = {c.legacy: c.canonical for c in CANONICAL_IDS.values()}


def _write(repo_dir: Path, configs: dict[str, dict[str, dict[str, list[Any]]]], *, layout: str) -> None:
    """`configs`: config -> split -> columns. `layout` "dir": `<config>/<split>-*.parquet`; "data": `data/...`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = ["---", "configs:"]
    for config, splits in configs.items():
        lines.append(f"- config_name: {config}")
        lines.append("  data_files:")
        for split, columns in splits.items():
            folder = "data" if layout == "data" else config
            rel = f"{folder}/{split}-00000-of-00001.parquet"
            (repo_dir / folder).mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table(columns), repo_dir / rel)
            lines.append(f"  - split: {split}")
            lines.append(f"    path: {folder}/{split}-*")
    lines += ["---", f"# {repo_dir.name} (a small copy for tests)", ""]
    (repo_dir / "README.md").write_text("\n".join(lines), encoding="utf-8")


def _choices(n: int, labels: list[str], offset: int) -> dict[str, list[str]]:
    return {"text": [f"option {label} of item {offset}" for label in labels[:n]], "label": labels[:n]}


def _mmlu(split: str, subject: str) -> dict[str, list[Any]]:
    return {
        "question": [f"{subject} {split} question {i}: which is right?" for i in range(ROWS)],
        "subject": [subject] * ROWS,
        "choices": [[f"choice {c} {i}" for c in "ABCD"] for i in range(ROWS)],
        "answer": [i % 4 for i in range(ROWS)],
    }


def _arc(split: str) -> dict[str, list[Any]]:
    return {
        "id": [f"arc-{split}-{i}" for i in range(ROWS)],
        "question": [f"{split} fact {i}?" for i in range(ROWS)],
        "choices": [{"text": [f"{c}{i}" for c in "ABCD"], "label": list("ABCD")} for i in range(ROWS)],
        "answerKey": ["ABCD"[i % 4] for i in range(ROWS)],
    }


def _openbookqa(split: str) -> dict[str, list[Any]]:
    return {
        "id": [f"obqa-{split}-{i}" for i in range(ROWS)],
        "question_stem": [f"The sun is a {split} thing number {i} that" for i in range(ROWS)],
        "choices": [_choices(4, ["A", "B", "C", "D"], i) for i in range(ROWS)],
        "answerKey": ["ABCD"[i % 4] for i in range(ROWS)],
    }


def _piqa(split: str) -> dict[str, list[Any]]:
    return {
        "goal": [f"To open a jar ({split} {i})" for i in range(ROWS)],
        "sol1": [f"twist the lid {i}" for i in range(ROWS)],
        "sol2": [f"hammer the lid {i}" for i in range(ROWS)],
        "label": [i % 2 for i in range(ROWS)],
    }


def _winogrande(split: str) -> dict[str, list[Any]]:
    return {
        "sentence": [f"The cup did not fit in the box because _ was too big ({split} {i})." for i in range(ROWS)],
        "option1": ["the cup"] * ROWS,
        "option2": ["the box"] * ROWS,
        "answer": [str(1 + i % 2) for i in range(ROWS)],
    }


def _hellaswag(split: str) -> dict[str, list[Any]]:
    return {
        "ind": [i for i in range(ROWS)],
        "activity_label": ["Baking cookies"] * ROWS,
        "ctx_a": [f"A person puts dough on a tray ({split} {i})." for i in range(ROWS)],
        "ctx_b": ["they"] * ROWS,
        "ctx": [f"A person puts dough on a tray ({split} {i}). they" for i in range(ROWS)],
        "endings": [[f"ending {e} of {i}" for e in range(4)] for i in range(ROWS)],
        "source_id": [f"activitynet~v_{i}" for i in range(ROWS)],
        "split": [split] * ROWS,
        "split_type": ["indomain"] * ROWS,
        "label": [str(i % 4) for i in range(ROWS)],
    }


def _gsm8k(split: str) -> dict[str, list[Any]]:
    return {
        "question": [f"What is {i} plus 1 ({split})?" for i in range(ROWS)],
        "answer": [f"{i} + 1 = <<{i}+1={i + 1}>>{i + 1}.\n#### {i + 1}" for i in range(ROWS)],
    }


def _humaneval() -> dict[str, list[Any]]:
    return {
        "task_id": [f"HumanEval/{i}" for i in range(ROWS)],
        "prompt": [f'def add_{i}(x: int) -> int:\n    """Return x plus {i}."""\n' for i in range(ROWS)],
        "canonical_solution": [f"    return x + {i}\n" for i in range(ROWS)],
        "test": [f"def check(candidate):\n    assert candidate(1) == {1 + i}\n" for i in range(ROWS)],
        "entry_point": [f"add_{i}" for i in range(ROWS)],
    }


MMLU_PRO_CATEGORIES = (
    *("biology", "business", "chemistry", "computer science", "economics", "engineering", "health", "history"),
    *("law", "math", "other", "philosophy", "physics", "psychology"),
)
MMLU_PRO_PER_CATEGORY = 5  # the task's 5-shot pool: the first 5 validation rows of the question's category


def _mmlu_pro(split: str) -> dict[str, list[Any]]:
    rows = [(c, i) for c in MMLU_PRO_CATEGORIES for i in range(MMLU_PRO_PER_CATEGORY)]
    return {
        "question_id": list(range(len(rows))),
        "question": [f"{c} {split} {i}: pick one." for c, i in rows],
        "options": [[f"o{k}" for k in range(10)] for _ in rows],
        "answer": ["ABCDEFGHIJ"[i % 10] for _, i in rows],
        "answer_index": [i % 10 for _, i in rows],
        "cot_content": [f"A: Let's think step by step. The answer is ({'ABCDEFGHIJ'[i % 10]})." for _, i in rows],
        "category": [c for c, _ in rows],
        "src": [f"ori_mmlu-{c}" for c, _ in rows],
    }


def mmlu_subjects() -> list[str]:
    """The 57 MMLU subjects, as lm-eval's `mmlu_str` group names its subtasks' `dataset_name`s."""
    from ckpteval.tasks.datasets import lm_eval_datasets

    return sorted({ref.name for ref in lm_eval_datasets("mmlu_str") if ref.name})


def write_repos(root: Path, *, mmlu: bool = True) -> Path:
    """Write the repositories under `root` (as the hub stand-in serves them) and return `root`."""
    if mmlu:
        subjects = mmlu_subjects()
        splits = ("test", "validation", "dev")
        _write(root / "hails/mmlu_no_train", {s: {sp: _mmlu(sp, s) for sp in splits} for s in subjects}, layout="dir")
    tvt = ("train", "validation", "test")
    _write(
        root / "allenai/ai2_arc", {c: {sp: _arc(sp) for sp in tvt} for c in ("ARC-Challenge", "ARC-Easy")}, layout="dir"
    )
    _write(
        root / ALIASES["openbookqa"],
        {c: {sp: _openbookqa(sp) for sp in tvt} for c in ("main", "additional")},
        layout="dir",
    )
    _write(root / "baber/piqa", {"default": {sp: _piqa(sp) for sp in ("train", "validation")}}, layout="data")
    _write(
        root / ALIASES["winogrande"],
        {"winogrande_xl": {sp: _winogrande(sp) for sp in ("train", "validation")}},
        layout="dir",
    )
    _write(root / ALIASES["hellaswag"], {"default": {sp: _hellaswag(sp) for sp in tvt}}, layout="data")
    _write(root / ALIASES["gsm8k"], {"main": {sp: _gsm8k(sp) for sp in ("train", "test")}}, layout="dir")
    _write(root / "openai/openai_humaneval", {"openai_humaneval": {"test": _humaneval()}}, layout="dir")
    pro = {"default": {sp: _mmlu_pro(sp) for sp in ("validation", "test")}}
    _write(root / "TIGER-Lab/MMLU-Pro", pro, layout="data")
    scripted = root / REMOTE_CODE_REPO
    scripted.mkdir(parents=True, exist_ok=True)
    (scripted / "scripted.py").write_text(
        "import datasets\n\nclass Scripted(datasets.GeneratorBasedBuilder):\n    pass\n"
    )
    _write(root / GATED_REPO, {"default": {"test": _piqa("test")}}, layout="data")
    return root
