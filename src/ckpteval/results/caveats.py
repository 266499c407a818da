"""What makes an invocation's numbers less than a verified score of the named model: its caveats.

One list, made here from results.json, shown everywhere a score is read (the run's closing screen and the
score table's notes, `evaluate status ID`, `evaluate report`, `evaluate compare`, whose gate
`--fail-on-regression` fails on them unless `--allow-caveats`):

- **no provenance**: nothing records which checkpoint, tokenizer or endpoint produced the numbers;
- **origin mismatch ignored**: the checkpoint's args disagree with the Hugging Face model it came from and
  the run went on (`deployment.ignore_origin_mismatch=true`);
- **endpoint not verified**: nothing checked that the endpoint answering was the job's own deployment
  (`deployment=none`, generic, Export-Deploy: they cannot report the job's identity);
- **settings mixed**: the endpoint, shared with other clients, was found to answer a batch of requests with
  one request's settings (the request-settings probe), so another client's requests may have set this run's;
- **echoed answers**: generations came back with their prompt echoed, or log-likelihood requests without
  log-probabilities (another request's settings): errors, retried, not scored, but a sign of the above;
- **answers from several checkpoints**: a task's answers name more than one checkpoint content (the
  `x-ckpteval-checkpoint` of each answer, `tasks.<t>.served.checkpoints`); collecting refuses to score such a
  task, so this shows on a results.json written otherwise;
- **checkpoint not reported**: the deployment reported nothing of what it loaded (Export-Deploy; vLLM and SGLang
  on a Megatron checkpoint do: their export step, `source: "export step"`): the record names the checkpoint
  described before submission, not the one served.

Each field is read by name and defensively (an older results.json lacks most of them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckpteval.results.model import InvocationResults
from ckpteval.results.provenance import EXPORT_STEP

NO_PROVENANCE = "no provenance"
ORIGIN_IGNORED = "origin mismatch ignored"
ENDPOINT_UNVERIFIED = "endpoint not verified"
SETTINGS_MIXED = "settings mixed"
ECHOED = "echoed answers"
SEVERAL_CHECKPOINTS = "answers from several checkpoints"
CHECKPOINT_UNREPORTED = "checkpoint not reported"
CAVEAT_MARK = "⚠"


@dataclass(frozen=True)
class Caveat:
    """One reason to trust the numbers less: `kind` (one of the names above) and a sentence that says why."""

    kind: str
    text: str

    def line(self) -> str:
        return f"{self.kind}: {self.text}"


def caveats(results: InvocationResults) -> list[Caveat]:
    """The caveats of one invocation's numbers, most serious first ([] for a verified run)."""
    p = results.provenance
    if p is None:
        return [
            Caveat(
                NO_PROVENANCE,
                "results.json records nothing of the checkpoint, tokenizer or endpoint behind these numbers",
            )
        ]
    out: list[Caveat] = []
    origin = p.origin or {}
    if origin.get("mismatch_ignored"):
        disagreements = "; ".join(str(d) for d in origin.get("disagreements") or [])
        out.append(
            Caveat(
                ORIGIN_IGNORED,
                f"the checkpoint's args disagree with {origin.get('origin')} ({disagreements}); "
                "run anyway with ignore_origin_mismatch=true",
            )
        )
    endpoint = p.endpoint or {}
    if not endpoint.get("verified"):
        kind = (p.deployment or {}).get("kind") or "not recorded"
        out.append(
            Caveat(
                ENDPOINT_UNVERIFIED,
                f"the deployment ({kind}) cannot report the job's identity: nothing checked that the answers "
                "came from this model",
            )
        )
    probe = endpoint.get("settings_probe") or {}
    if endpoint.get("owned") is False and probe.get("verdict") not in (None, "honoured"):
        reason = f" ({probe['reason']})" if probe.get("reason") else ""
        out.append(
            Caveat(
                SETTINGS_MIXED,
                f"the shared endpoint's request-settings probe says {probe['verdict']}{reason}: "
                "other clients' requests may have set this run's",
            )
        )
    echoed = {
        t: int(v.get("echoed_answers") or 0) + int(v.get("answers_without_logprobs") or 0)
        for t, v in (p.tasks or {}).items()
    }
    if any(echoed.values()):
        counts = ", ".join(f"{t} {n}" for t, n in echoed.items() if n)
        out.append(
            Caveat(
                ECHOED,
                "answers with another request's settings (a prompt echoed, log-probabilities missing), retried "
                f"and not scored: {counts}",
            )
        )
    mixed = _several_checkpoints(p)
    if mixed:
        counts = ", ".join(f"{t} {n}" for t, n in mixed.items())
        out.append(Caveat(SEVERAL_CHECKPOINTS, f"answers named more than one checkpoint content: {counts}"))
    checkpoint = p.checkpoint or {}
    if checkpoint.get("source") and checkpoint.get("source") not in ("server", EXPORT_STEP):
        out.append(
            Caveat(
                CHECKPOINT_UNREPORTED,
                f"the deployment reported nothing of what it loaded: iteration {checkpoint.get('iteration')} is "
                "the one described before submission",
            )
        )
    return out


def _several_checkpoints(p: Any) -> dict[str, int]:
    """Per task, how many checkpoint contents its answers named, where more than one
    (`provenance.tasks.<task>.served.checkpoints`, from the harness hook's `served.json`)."""
    out: dict[str, int] = {}
    for task, fields in (getattr(p, "tasks", None) or {}).items():
        served = fields.get("served") if isinstance(fields, Mapping) else None
        contents = served.get("checkpoints") if isinstance(served, Mapping) else None
        if isinstance(contents, list) and len(contents) > 1:
            out[task] = len(contents)
    return out


def caveat_notes(results: Sequence[InvocationResults]) -> list[str]:
    """The caveats as notes under a score table, one line each (named by invocation when several)."""
    several = len(results) > 1
    return [
        f"{CAVEAT_MARK} {f'{r.label or r.invocation}: ' if several else ''}{c.line()}"
        for r in results
        for c in caveats(r)
    ]
