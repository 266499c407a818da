"""Progress of a running task: requests answered (from nemo-evaluator's progress file) out of requests to send."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from ckpteval.tasks.harness_hook import ckpteval_offline_data as od
from ckpteval.tasks.progress import Progress, expected_requests, read_progress

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mmlu_offline", Progress(57, 57)),
        ("hellaswag_offline", Progress(20, 20)),
        ("humaneval_offline", Progress(5, 5)),
    ],
)
def test_finished_real_runs(name: str, expected: Progress) -> None:
    assert read_progress(GOLDEN / name / "artifacts") == expected


def _running(tmp_path: Path, params: dict[str, object]) -> Path:
    out = tmp_path / "artifacts"
    out.mkdir(parents=True)
    (out / "run_config.yml").write_text(yaml.safe_dump({"config": {"type": "x", "params": params}}))
    return out


def test_before_the_harness_has_its_data_the_total_is_unknown(tmp_path: Path) -> None:
    out = _running(tmp_path, {"task": "hellaswag", "limit_samples": 5})
    assert read_progress(out) == Progress(0, None)
    assert read_progress(tmp_path / "not-started") == Progress(0, None)


def test_total_follows_the_data_in_use(tmp_path: Path) -> None:
    out = _running(tmp_path, {"task": "hellaswag"})
    (out / "progress").write_text("7")
    assert read_progress(out) == Progress(7, 4 * 10042)  # requests started with no offline report: hub data
    (out / od.REPORT_FILE).write_text(json.dumps({"datasets": [{"served_from": "package"}]}))
    assert read_progress(out) == Progress(7, 4 * 80)


def test_done_never_exceeds_total(tmp_path: Path) -> None:
    # a request answered after the client gave up on it is counted, and then its retry again
    out = _running(tmp_path, {"task": "hellaswag", "limit_samples": 2})
    (out / "progress").write_text("9")
    assert read_progress(out) == Progress(8, 8)


def test_expected_requests() -> None:
    sizes = [len(test) + len(dev) for test, dev in od._mmlu_by_subject().values()]
    assert expected_requests({"task": "mmlu_str"}, offline=False) == 14042
    assert expected_requests({"task": "mmlu_str"}, offline=True) == 14042 - 57 * 5
    assert expected_requests({"task": "mmlu_str", "limit_samples": 5}, offline=False) == 57 * 5
    assert expected_requests({"task": "mmlu_str", "limit_samples": 0.01}, offline=False) == sum(
        math.ceil(n * 0.01) for n in sizes
    )
    assert expected_requests({"task": "hellaswag", "limit_samples": 5}, offline=True) == 20
    assert expected_requests({"task": "gsm8k"}, offline=False) == 1319
    assert expected_requests({"task": "gsm8k"}, offline=True) == 90
    assert expected_requests({"task": "adlr_humaneval_greedy"}, offline=True) == 164
    assert expected_requests({"task": "piqa"}, offline=False) is None
    assert expected_requests({"task": "hellaswag", "extra": {"downsampling_ratio": 0.1}}, offline=False) is None


def test_unreadable_progress_file_counts_as_zero(tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    shutil.copytree(GOLDEN / "hellaswag_offline" / "artifacts", out)
    (out / "progress").write_text("")
    assert read_progress(out) == Progress(0, 20)
