"""A judge-scored task end to end: `evaluate -c tiny -t mtbench judge=api ...` against a real OpenAI-shaped
judge over HTTP (tests/support/judge_standin.py), the model being SmolLM2 served by the job's own builtin
deployment (`-c tiny`), on two MT-Bench questions (two turns each: four judgments); and `judge=builtin`: SmolLM2
as the judge too, a second builtin server the job starts beside the model, on one question, every request
counted at each server.

The judge answers garbage to one judged prompt in four, every time it is asked again (MT-Bench re-asks an
unreadable reply five times): one judgment of four holds no rating. Every judge request reaches the judge,
with the judge's model id and the key from the owner-only file; results.json names the judge. With
`judge.max_error_rate=0.5` the task scores and says "judge errors 1 of 4" beside its score in the closing
table, in `status` (the invocation and the list, text and JSON) and in results.json; with the default 0.05
the task fails with the judge's last replies in its log, and no score is printed. Needs the `judge` extra
(nvidia-mtbench-evaluator).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.judge_standin import JudgeStandIn

pytest.importorskip("core_evals.mtbench")

# about 4 minutes a run on 2 cores: the harness answers each turn, then judges it; two runs
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.long]

KEY = "s3cret-judge-key-0123"
PARAMS = "evaluation.nemo_evaluator_config.config.params"


def _evaluate(judge: JudgeStandIn | None, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CKPTEVAL_")},
        "XDG_STATE_HOME": str(cwd / "state"),
        "XDG_CONFIG_HOME": str(cwd / "config"),
        "MY_JUDGE_KEY": KEY,
        "COLUMNS": "80",
    }
    api = ()
    if judge is not None:
        api = (
            "judge=api",
            f"judge.url={judge.url}",
            f"judge.model_id={judge.model_id}",
            "judge.api_key_name=MY_JUDGE_KEY",
        )
    argv = [
        *("-c", "tiny", "-t", "mtbench"),
        *api,
        # two questions against an API judge (one judgment in four unreadable), one against a builtin judge
        *(f"{PARAMS}.limit_samples={2 if judge is not None else 1}", f"{PARAMS}.max_new_tokens=8"),
        f"{PARAMS}.parallelism=1",
        *extra,
    ]
    return subprocess.run(
        [str(Path(sys.executable).parent / "evaluate"), *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def _job_dir(cwd: Path) -> Path:
    [job] = [p for p in (cwd / "results").iterdir() if (p / "job.sh").is_file()]
    return job


def _table_rows(stdout: str) -> list[list[str]]:
    """The body rows of the closing score table rich drew (cells between its │ rules)."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in stdout.splitlines() if line.startswith("│")]


def _status(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CKPTEVAL_")},
        "XDG_STATE_HOME": str(cwd / "state"),
        "XDG_CONFIG_HOME": str(cwd / "config"),
        "COLUMNS": "80",
    }
    evaluate = str(Path(sys.executable).parent / "evaluate")
    return subprocess.run([evaluate, "status", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_an_api_judge_scores_mtbench_names_itself_and_its_errors_are_counted(tmp_path: Path) -> None:
    judge = JudgeStandIn(model_id="judge-standin", rating=7, garbage_every_prompt=4, api_key=KEY).start()
    try:
        proc = _evaluate(judge, tmp_path, "judge.max_error_rate=0.5")
    finally:
        judge.stop()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # every request with the judge's id and the key; five distinct prompts: MT-Bench's validation request and
    # the four judgments, the garbage one asked five times
    assert judge.unauthorized == 0
    assert {r["model"] for r in judge.requests} == {"judge-standin"}
    assert len(judge.prompts) == 5 and len(judge.requests) == 4 + 5
    job = _job_dir(tmp_path)
    results = json.loads((job / "results.json").read_text())
    assert results["provenance"]["judge"]["model_id"] == "judge-standin"
    assert results["provenance"]["judge"]["url"] == judge.url
    assert results["provenance"]["judge"]["verified"] is True  # its /v1/models was checked before any request
    assert results["provenance"]["judge"]["settings"]["mtbench"]["temperature"] == 0.0
    mtbench = results["tasks"]["mtbench"]
    assert mtbench["status"] == "succeeded" and mtbench["metrics"]["average_score"]["value"] == 7.0
    assert mtbench["judge_errors"] == {"errors": 1, "judgments": 4, "max_error_rate": 0.5}
    # beside the score in the closing table, and in status (the invocation, the list, JSON)
    rows = _table_rows(proc.stdout)
    assert rows[0] == ["mtbench", "average_score", "7.0000", ""] and ["", "judge errors", "1 of 4", ""] in rows
    assert "judge errors 1 of 4" in " ".join(proc.stdout.split())  # and the judge's note under the table
    invocation = results["invocation"]
    shown = _status(tmp_path, invocation)
    assert shown.returncode == 0 and "mtbench: judge errors 1 of 4" in shown.stdout, shown.stdout
    listed = _status(tmp_path)
    assert "(judge errors 1 of 4)" in " ".join(listed.stdout.split()), listed.stdout
    [as_json] = json.loads(_status(tmp_path, invocation, "--json").stdout)
    [task] = as_json["tasks"]
    assert task["judge_errors"] == {"errors": 1, "judgments": 4, "max_error_rate": 0.5}
    # the key reached the task only through its file: nowhere in what was written or printed
    written = "".join(
        p.read_text(errors="replace") for p in job.rglob("*") if p.is_file() and ".secrets" not in p.parts
    )
    assert KEY not in written + proc.stdout + proc.stderr


def test_past_the_threshold_the_judge_fails_the_task_and_no_score_is_printed(tmp_path: Path) -> None:
    judge = JudgeStandIn(model_id="judge-standin", garbage_every_prompt=4, api_key=KEY).start()
    try:
        proc = _evaluate(judge, tmp_path)  # judge.max_error_rate: the default 0.05
    finally:
        judge.stop()
    assert proc.returncode != 0
    job = _job_dir(tmp_path)
    log = (job / "tasks" / "mtbench" / "client.log").read_text(errors="replace")
    assert "judge errors 1 of 4" in log and "I cannot decide." in log  # the judge's last replies
    results = json.loads((job / "results.json").read_text())
    mtbench = results["tasks"]["mtbench"]
    assert mtbench["status"] == "failed" and mtbench["metrics"] == {}
    assert mtbench["judge_errors"]["errors"] == 1 and mtbench["judge_errors"]["judgments"] == 4
    assert mtbench["error"].startswith("Judge errors 1 of 4: more than 5%")
    # the closing table prints no score for it, only that it failed and why
    rows = _table_rows(proc.stdout)
    assert rows == [["mtbench", "failed", "—", ""], ["", "judge errors", "1 of 4", ""]], proc.stdout
    assert "7.0000" not in proc.stdout
    assert "mtbench failed: Judge errors 1 of 4" in " ".join(proc.stdout.split())


def _chat_requests(log: Path) -> int:
    """POSTs a builtin server answered on its chat route, from its access log (`access_log: true`)."""
    return sum('"POST /v1/chat/completions' in line for line in log.read_text(errors="replace").splitlines())


# two SmolLM2 servers on CPU, and the judge asked again for each reply without a rating: 13 min at load ~18
@pytest.mark.timeout(1800)
def test_a_builtin_judge_is_a_second_server_of_the_job(tmp_path: Path) -> None:
    from tests.e2e.conftest import packaged_checkpoint

    judge_checkpoint = packaged_checkpoint("smol")
    proc = _evaluate(
        None,
        tmp_path,
        *("judge=builtin", f"judge.checkpoint_path={judge_checkpoint}"),
        # each server logs every request it answers: they are counted below
        *("deployment.access_log=true", "judge.access_log=true"),
        # a 135M judge rarely writes MT-Bench's [[rating]]: its replies are counted, not required
        *("judge.max_error_rate=1.0", f"+{PARAMS}.extra.judge.max_tokens=16"),
    )
    job = _job_dir(tmp_path)
    log = (job / "tasks" / "mtbench" / "client.log").read_text(errors="replace")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + log[-3000:]
    state = job / "state"
    # two servers, each on its own port, each verified as the job's own (two identities)
    ports = {(state / "deployment_port").read_text().strip(), (state / "judge_port").read_text().strip()}
    identities = {(state / "deployment_identity").read_text().strip(), (state / "judge_identity").read_text().strip()}
    assert len(ports) == 2 and len(identities) == 2
    judge_port = (state / "judge_port").read_text().strip()
    # the harness was told the judge, and checked it before sending it anything
    assert f"judge judge at http://127.0.0.1:{judge_port}/v1 verified (identity " in log
    # counted at each server: the model answered the two turns and nothing else; the judge the harness's
    # validation and every judgment (MT-Bench asks again, up to 5 times, for a reply that holds no rating)
    judgments = (job / "tasks" / "mtbench" / "output").rglob("judgements/*_single.jsonl")
    rows = [json.loads(line) for path in judgments for line in path.read_text().splitlines() if line.strip()]
    assert len(rows) == 2
    assert _chat_requests(job / "logs" / "deployment.log") == 2
    unreadable = sum(r["score"] == -1 for r in rows)
    assert 1 + len(rows) <= _chat_requests(job / "logs" / "judge.log") <= 1 + len(rows) + 4 * unreadable
    results = json.loads((job / "results.json").read_text())
    judge = results["provenance"]["judge"]
    assert (judge["kind"], judge["model_id"], judge["verified"]) == ("deployed", "judge", True)
    assert judge["identity"] == (state / "judge_identity").read_text().strip()
    assert judge["checkpoint_path"] == str(judge_checkpoint)
    # every judgment counted, the unreadable ones as errors (the threshold above lets them through)
    counted = results["tasks"]["mtbench"]["judge_errors"]
    assert (counted["judgments"], counted["errors"]) == (len(rows), unreadable)
