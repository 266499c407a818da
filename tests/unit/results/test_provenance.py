"""results.json's provenance where the results go besides results.json: its summary (MLflow's flat parameters,
the report, Inspect logs: tests/unit/export/test_inspect_logs.py), the W&B run config, the report's invocations
table."""

from __future__ import annotations

import dataclasses

from ckpteval.results.model import InvocationResults, Metric, TaskOutcome
from ckpteval.results.provenance import Provenance, provenance_summary

PROVENANCE = Provenance(
    checkpoint={
        "layout": "megatron-lm",
        "format": "torch_dist",
        "iteration": 1000,
        "metadata_sha256": "9c1e" * 16,
        "files_sha256": "47ab" * 16,
        "source": "server",
        "verified": True,
    },
    tokenizer={"kind": "HuggingFaceTokenizer", "origin": "the checkpoint's tokenizer", "sha256": "d2f0" * 16},
    origin={"origin": "deployment.origin=/models/x", "disagreements": ["rotary_base=10000 in the checkpoint, ..."]},
    deployment={"kind": "megatron/builtin"},
    endpoint={"identity": "abcd1234-5f2e", "verified": True},
    harness={"where": "this machine", "versions": {"nemo-evaluator": "0.2.6"}},
    tasks={"mmlu": {"settings": {"temperature": 0.0, "parallelism": 8, "extra": {"num_fewshot": 5}}}},
)
RESULTS = InvocationResults(
    invocation="abcd1234",
    created="2026-11-27T10:00:00Z",
    status="succeeded",
    tasks={"mmlu": TaskOutcome(name="mmlu", status="succeeded", metrics={"acc": Metric(0.5, 0.05, 100)})},
    provenance=PROVENANCE,
)


def test_the_summary_names_the_checkpoint_tokenizer_origin_endpoint_and_settings() -> None:
    lines = provenance_summary(PROVENANCE, "mmlu")
    assert lines["checkpoint"] == (
        "megatron-lm torch_dist iteration 1000 as served; metadata 9c1e9c1e9c1e, content 47ab47ab47ab"
    )
    described = {**(PROVENANCE.checkpoint or {}), "source": "description before submission", "verified": False}
    assert (
        "not reported by the server"
        in provenance_summary(dataclasses.replace(PROVENANCE, checkpoint=described))["checkpoint"]
    )
    assert lines["tokenizer"] == "HuggingFaceTokenizer d2f0d2f0d2f0"
    assert lines["origin"].startswith("deployment.origin=/models/x: DISAGREES, run anyway: rotary_base=10000")
    assert lines["endpoint"] == "abcd1234-5f2e" and lines["harness"] == "nemo-evaluator 0.2.6"
    assert lines["settings"] == "extra.num_fewshot=5, temperature=0.0"  # not how requests are sent (parallelism)
    unverified = dataclasses.replace(PROVENANCE, endpoint={"identity": None, "note": "not verifiable"})
    assert provenance_summary(unverified)["endpoint"] == "not verifiable"
    assert provenance_summary(None) == {}


def test_the_wandb_config_and_the_report_carry_it() -> None:
    from ckpteval.export.content import ExportContent, run_config
    from ckpteval.report.html import _invocations

    config = run_config(ExportContent(invocation="abcd1234", results=RESULTS, config={}))
    assert config["ckpteval"]["provenance"] == dataclasses.asdict(PROVENANCE)
    page = _invocations([RESULTS, dataclasses.replace(RESULTS, invocation="old00001", provenance=None)])
    assert "produced by" in page and "endpoint: abcd1234-5f2e" in page and "old00001" in page


def test_what_the_job_recorded_where_it_ran(tmp_path) -> None:
    """The harness's versions as its task's environment had them (not the submitting machine's), the probe's
    verdict on an endpoint the job does not own, with its limits, and the echoed answers a task refused."""
    import json

    import yaml

    from ckpteval.results.caveats import caveats
    from ckpteval.results.provenance import PROBE_LIMITS, read_provenance

    (tmp_path / "job.yaml").write_text(
        yaml.safe_dump(
            {
                "versions": {"nvidia-lm-eval": "0.0.1-the-laptop", "nemo-evaluator": "0.0.1-the-laptop"},
                "deployment": {"kind": "none", "endpoint_owned": False},
            }
        )
    )
    output = tmp_path / "tasks" / "gsm8k" / "output"
    output.mkdir(parents=True)
    ran = {"python": "3.10.12", "packages": {"nvidia-lm-eval": "25.9", "nemo-evaluator": "0.2.3"}}
    (output / "ckpteval_versions.json").write_text(json.dumps(ran))
    (output / "eval_factory_metrics.json").write_text(json.dumps({"response_stats": {"echoed_count": 8}}))
    (tmp_path / "state").mkdir()
    probe = {"verdict": "mixed", "reason": "5 of 20 answers differ", "seconds": 3.1, "left_out": []}
    (tmp_path / "state" / "request_probe.json").write_text(json.dumps(probe))

    p = read_provenance(tmp_path, [("gsm8k", "tasks/gsm8k")])
    assert p.harness["versions"] == {"nemo-evaluator": "0.2.3", "nvidia-lm-eval": "25.9", "python": "3.10.12"}
    assert p.harness["versions_from"] == "the job (where its tasks ran)"
    assert p.endpoint["owned"] is False and "endpoint_owned" not in p.deployment
    assert p.endpoint["settings_probe"] == {**probe, "limits": PROBE_LIMITS}
    assert p.tasks["gsm8k"]["echoed_answers"] == 8
    results = dataclasses.replace(RESULTS, tasks={}, provenance=p)
    assert [c.kind for c in caveats(results)] == ["endpoint not verified", "settings mixed", "echoed answers"]
    assert provenance_summary(p)["settings probe"] == "mixed: 5 of 20 answers differ"

    # a job whose tasks recorded nothing: the submitting machine's, said so
    (output / "ckpteval_versions.json").unlink()
    older = read_provenance(tmp_path, [("gsm8k", "tasks/gsm8k")])
    assert older.harness["versions"]["nvidia-lm-eval"] == "0.0.1-the-laptop"
    assert older.harness["versions_from"] == "the submitting machine (job.yaml)"
