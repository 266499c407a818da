"""HumanEval offline: the harness's own task and sanitizer, our sandboxed code_eval, hostile completions."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpteval.tasks.results import read_task_result
from ckpteval.tasks.samples import read_sample_lines
from tests.e2e.tasks.conftest import FakeEndpoint, run_task
from tests.e2e.tasks.fake_endpoint import ESCAPE_MARKER

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_humaneval_scores_completions_in_the_sandbox(
    fake_endpoint: Callable[..., FakeEndpoint], tmp_path: Path
) -> None:
    Path(ESCAPE_MARKER).unlink(missing_ok=True)
    # problems 0 and 2: the reference solution; 1: an infinite loop; 3: code that calls the endpoint and
    # writes into /tmp before returning the right answer
    endpoint = fake_endpoint("--answer", "humaneval-mixed")
    run = run_task("adlr_humaneval_greedy", tmp_path / "humaneval", url=endpoint.url, params={"limit_samples": 4})
    assert run.returncode == 0, run.paths.log.read_text()[-3000:]
    result = read_task_result(run.paths.output_dir)
    assert result.metrics["pass_at_1__n=1__evalplus_sanitize"].value == pytest.approx(0.5)
    assert result.n_samples == 4
    samples = next(run.paths.output_dir.glob("*/samples_adlr_humaneval_greedy_*.jsonl"))
    passed = {
        json.loads(line)["doc"]["task_id"]: json.loads(line)["pass_at_1"] for line in samples.read_text().splitlines()
    }
    assert passed == {"HumanEval/0": 1.0, "HumanEval/1": 0.0, "HumanEval/2": 1.0, "HumanEval/3": 0.0}
    # the same scores per document, as samples.jsonl and `evaluate compare` read them
    lines = read_sample_lines(run.paths.output_dir, "adlr_humaneval_greedy")
    assert [line.scores for line in lines] == [{"pass_at_1__n=1__evalplus_sanitize": s} for s in (1.0, 0.0, 1.0, 0.0)]
    assert not Path(ESCAPE_MARKER).exists()
    assert all(start != json.dumps("ESCAPED") for _, _, start in endpoint.received())
    assert "code_eval: ckpteval's sandboxed implementation" in run.paths.log.read_text()
