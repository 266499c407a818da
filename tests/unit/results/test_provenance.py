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
