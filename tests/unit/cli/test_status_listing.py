"""`evaluate status` lists every invocation even when one's cluster cannot be reached."""

from __future__ import annotations

import json
import socket

from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.config.profiles import make_profile
from ckpteval.execution.slurm_state import SlurmSubmission
from ckpteval.invocation.record import InvocationRecord, TaskEntry


def refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: connecting is refused


def test_an_unreachable_cluster_makes_its_invocations_unknown_not_the_listing_fail(isolated_user):
    profile = make_profile(name="gone", host="127.0.0.1", port=refused_port(), user="me", remote_job_dir="/x")
    InvocationRecord(
        id="aaaa0001",
        created="2026-01-01T00:00:00Z",
        mode="batch",
        profile="gone",
        executor="slurm",
        job_dir="/x/evaluations/aaaa0001",
        tasks=[TaskEntry("adlr_mmlu", "tasks/adlr_mmlu")],
        placement=SlurmSubmission(connection=profile.to_config(), sbatch={}, job_ids=["42"]),
    ).save()
    InvocationRecord(
        id="bbbb0002",
        created="2026-01-02T00:00:00Z",
        mode="batch",
        profile="gone",
        executor="slurm",
        job_dir="/x/evaluations/bbbb0002",
        tasks=[TaskEntry("adlr_mmlu", "tasks/adlr_mmlu")],
        placement=SlurmSubmission(
            connection=profile.to_config(), sbatch={}, submit_error="Slurm refused the job (sbatch): no"
        ),
    ).save()
    result = CliRunner().invoke(app, ["status", "--json"])
    assert result.exit_code == 0, result.output
    listed = {s["invocation"]: s for s in json.loads(result.stdout)}
    assert listed["aaaa0001"]["state"] == "unknown"
    assert listed["aaaa0001"]["detail"].startswith("Cannot reach 127.0.0.1:")
    assert listed["bbbb0002"]["state"] == "failed"
    assert listed["bbbb0002"]["detail"] == "not submitted: Slurm refused the job (sbatch): no"
    single = CliRunner().invoke(app, ["status", "aaaa0001"])
    assert single.exit_code == 1 and "Cannot reach 127.0.0.1:" in single.output and "Traceback" not in single.output


def test_status_json_gives_what_an_invocation_cost_as_numbers(isolated_user, tmp_path):
    """The usage line `status` prints, as results.json's numbers, for scripts (GPU-hours, wall, the split);
    null while an invocation has no results here."""
    from tests.support.comparisons import record_invocation, sample_rows

    record_invocation(tmp_path, "cccc0003", {"mmlu": sample_rows("mmlu", {"exact_match": [1.0, 0.0, 1.0]})})
    results = tmp_path / "cccc0003" / "results.json"
    data = json.loads(results.read_text())
    data["usage"] = {
        "source": "job clock",
        "wall_seconds": 7200.0,
        "gpus": 2,
        "gpu_hours": 4.0,
        "phases": {"startup": 600.0, "tasks": 6000.0, "idle": 600.0},
        "cpu_seconds": None,
        "deployment": "own",
    }
    results.write_text(json.dumps(data))

    listed = {s["invocation"]: s for s in json.loads(CliRunner().invoke(app, ["status", "--json"]).stdout)}
    usage = listed["cccc0003"]["usage"]
    assert (usage["gpu_hours"], usage["gpus"], usage["wall_seconds"]) == (4.0, 2, 7200.0)
    assert usage["phases"] == {"startup": 600.0, "tasks": 6000.0, "idle": 600.0}
    assert "used 4 GPU-h (2 GPUs" in CliRunner(env={"COLUMNS": "80"}).invoke(app, ["status", "cccc0003"]).output

    results.unlink()
    again = {s["invocation"]: s for s in json.loads(CliRunner().invoke(app, ["status", "--json"]).stdout)}
    assert again["cccc0003"]["usage"] is None
