"""What produced an invocation's numbers: results.json's `provenance`, and the differences `compare` warns of.

Made when the results are collected, from the job directory: job.yaml (written before submission: the
checkpoint's identity, its tokenizer and origin as checked, the deployment's kind, image and command line,
ckpteval's and the harness's versions here), `state/served_checkpoint.json` (what the builtin server
reported it loaded: this, not the description, is the record's checkpoint; for vLLM/SGLang on a Megatron
checkpoint `state/hf_export.json`, what the export step read and the export the engine served),
`state/deployment_identity` (written by the job once the health check verified that the endpoint is its own
deployment), the tokenizer the builtin server published (`tokenizer/`), the builtin server's exit line in its
log (its prompt tokens, those it computed and those its prefix cache served: `deployment.prompt_tokens`), and
each task's run config, harness output (the effective request settings, the harness's versions) and
`served.json` (what answered it, what was replayed). Reads no weight.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.invocation.jobdir import JobDir
from ckpteval.tasks.harness_hook.ckpteval_responses import METRICS_FILE, VERSIONS_FILE

NOT_VERIFIABLE = "not verifiable"
EXPORT_STEP = "export step"  # results.json's checkpoint.source where vLLM/SGLang served a Megatron checkpoint
# request settings that change how a task's requests are sent, not what they ask (and paths, which differ per
# job): left out of compare's warning
_TRANSPORT = ("parallelism", "request_timeout", "max_retries", "extra.tokenizer", "extra.tokenized_requests")
HARNESS_PACKAGES = ("nemo-evaluator", "nemo-evaluator-launcher", "nvidia-lm-eval")


@dataclass(frozen=True)
class Provenance:
    """What produced the numbers (see the module docstring); plain JSON values, as results.json holds them."""

    checkpoint: dict[str, Any] | None = None  # what the server loaded (`served_checkpoint`), else as described
    tokenizer: dict[str, Any] | None = None  # kind, origin, sha256 (its files), served_sha256 (published)
    origin: dict[str, Any] | None = None  # the Hugging Face model compared with the checkpoint's args
    deployment: dict[str, Any] = field(default_factory=dict)  # kind, image, command, versions
    endpoint: dict[str, Any] = field(default_factory=dict)  # identity verified, or NOT_VERIFIABLE
    harness: dict[str, Any] = field(default_factory=dict)  # versions, and where the harness ran
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)  # task -> settings, harness versions, image
    # the judge of judge-scored tasks: role, kind (api, self), model id, URL or the model's identity, verified,
    # and its request settings per task; None: no judge
    judge: dict[str, Any] | None = None


def read_provenance(job_dir: Path, tasks: Sequence[tuple[str, str]]) -> Provenance:
    """The provenance of the job in `job_dir`; `tasks` are (name, task dir)."""
    submitted = _yaml(job_dir / JobDir.PROVENANCE)
    versions = submitted.get("versions") or {}
    deployment = dict(submitted.get("deployment") or {})
    if str(deployment.get("kind", "")).endswith("builtin"):
        deployment["versions"] = {k: versions[k] for k in ("ckpteval", "megatron-core", "torch") if k in versions}
        deployment["prompt_tokens"] = _prompt_tokens(job_dir)
    tokenizer = dict(submitted["tokenizer"]) if submitted.get("tokenizer") else None
    published = job_dir / JobDir.TOKENIZER
    if published.is_dir():
        from ckpteval.checkpoint.tokenizer_source import tokenizer_sha256

        tokenizer = (tokenizer or {}) | {"served_sha256": tokenizer_sha256({"directory": published})}
    if "versions" in deployment:
        deployment["versions_from"] = "the submitting machine (job.yaml)"
    exported = _json_file(job_dir / JobDir.HF_EXPORT_REPORT)
    if exported is not None:  # vLLM/SGLang on a Megatron checkpoint: the export served, its parity report
        deployment["hf_export"] = exported
    images = submitted.get("task_images") or {}
    endpoint = _endpoint(job_dir, deployment.pop("endpoint_owned", None))
    per_task = {name: _task(job_dir / task_dir, images.get(name)) for name, task_dir in tasks}
    return Provenance(
        checkpoint=served_checkpoint(job_dir, submitted.get("checkpoint")),
        tokenizer=tokenizer,
        origin=submitted.get("origin"),
        deployment=deployment,
        endpoint=endpoint,
        harness=_harness(versions, per_task, bool(images)),
        tasks=per_task,
        judge=_judge(submitted.get("judge"), endpoint, per_task, job_dir),
    )


def _json_file(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def served_checkpoint(job_dir: Path, planned: dict[str, Any] | None) -> dict[str, Any] | None:
    """The record's `checkpoint` (results.json): what the server reported it loaded (`state/served_checkpoint.json`,
    `source: "server"`, `verified: true`), or for vLLM/SGLang on a Megatron checkpoint what the job's export step
    read and served (`state/hf_export.json`, `source: "export step"`: `served_export`), with the description made
    before submission under `planned` and every difference between the two under `mismatch` (`collect_results`
    refuses to score then: see docs/results.md); the description alone (`source: "description before
    submission"`, `verified: false`) where the deployment reports nothing (Export-Deploy, generic)."""
    try:
        served = json.loads((job_dir / JobDir.SERVED_CHECKPOINT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        served = None
    if not isinstance(served, dict):
        exported = served_export(_json_file(job_dir / JobDir.HF_EXPORT_REPORT))
        if exported is not None:
            return _against_plan(exported, planned)
        if planned is None:
            return None
        return {**planned, "source": "description before submission", "verified": False}
    content = served.get("content") or {}
    out: dict[str, Any] = {
        "source": "server",
        "verified": True,
        "path": served.get("path"),
        "iteration": _iteration(served.get("iteration")),
        "files_sha256": content.get("sha256"),  # the content of every file read (content.method: how)
        "content": {k: content.get(k) for k in ("sha256", "method", "n_files", "total_bytes", "bytes_read", "seconds")},
        "architecture": served.get("architecture"),
        "device": served.get("device"),
        "dtype": served.get("dtype"),
        # loaded into a server that served another checkpoint before (`evaluate watch` keeps one: server.inplace)
        "in_place": bool(served.get("in_place")),
    }
    return _against_plan(out, planned)


def served_export(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """The record's `checkpoint` where vLLM or SGLang served a Megatron checkpoint's export: the iteration
    directory the job's export step read, its content identity (the step hashed its files' bytes: the same
    identity the builtin server reports), and `served_as`, the export the engine served: its directory and
    cache key, whether this job wrote it or found it, its dtype and the parity check that proved it computes
    what that content computes. None when the step exported nothing (a Hugging Face directory served as it
    is) or left no report."""
    if not report or report.get("kind") not in ("exported", "reused") or not report.get("identity"):
        return None
    method, _, sha256 = str(report["identity"]).rpartition(":")
    export = report.get("export") or {}
    parity = report.get("parity") or {}
    directory = str(report.get("served") or "")
    path = str(report.get("checkpoint") or "")
    iteration = Path(path).name.removeprefix("iter_")
    return {
        "source": EXPORT_STEP,
        "verified": bool(parity.get("passed")),
        "path": path,
        "iteration": _iteration(iteration),
        "files_sha256": sha256,
        "content": {"sha256": sha256, "method": method},
        "dtype": export.get("checkpoint_dtype"),
        "in_place": False,
        "served_as": {
            "engine_reads": directory,
            "cache_key": Path(directory).name,
            "written": report["kind"],  # "exported" by this job, or "reused": found in the cache
            "tensors_written": report.get("tensors_written"),
            "architecture": export.get("architecture"),
            "dtype": export.get("dtype"),
            "parity": {
                **{k: parity.get(k) for k in ("passed", "max_abs_logit_diff", "tolerance", "greedy_identical")},
                "tensors_compared": parity.get("tensors_compared"),
                "kept_from_an_earlier_check": bool(report.get("parity_reused")),
            },
        },
    }


def _against_plan(out: dict[str, Any], planned: dict[str, Any] | None) -> dict[str, Any]:
    if planned:
        kept = ("layout", "format", "metadata_sha256", "unexpected_tensors", "unexpected_tensors_ignored")
        out |= {k: planned[k] for k in kept if k in planned}
        out["planned"] = planned
        out["mismatch"] = _planned_vs_served(planned, out)
    return out


def _iteration(value: Any) -> Any:
    return int(value) if isinstance(value, str) and value.isdigit() else value


def _planned_vs_served(planned: dict[str, Any], served: dict[str, Any]) -> list[str]:
    """How what was served differs from what was described before submission: its iteration and directory."""
    out = []
    want = planned.get("iteration")
    want = "release" if want is None and planned.get("path", "").endswith("release") else want
    if want != served.get("iteration"):
        out.append(f"iteration {served.get('iteration')} was served, iteration {want} was planned")
    if planned.get("path") and served.get("path") and Path(planned["path"]).name != Path(served["path"]).name:
        out.append(f"{served['path']} was served, {planned['path']} was planned")
    return out


def task_served(task_dir: Path) -> dict[str, Any]:
    """What answered a task, over all its runs (a resumed task has several; repeats each theirs): the
    checkpoint contents named by its answers, and how many answers each cache replayed (`served.json`, written
    by the harness hook: `ckpteval_responses`)."""
    runs: list[dict[str, Any]] = []
    for path in sorted(task_dir.glob("output*/served.json")):
        try:
            found = json.loads(path.read_text(encoding="utf-8")).get("runs")
        except (OSError, ValueError, AttributeError):
            continue
        runs.extend(r for r in found or [] if isinstance(r, dict))
    if not runs:
        return {}
    replayed = {"ckpteval": 0, "lm_eval": 0}
    for run in runs:
        for cache, n in (run.get("replayed") or {}).items():
            replayed[cache] = replayed.get(cache, 0) + int(n or 0)
    return {
        "runs": len(runs),
        "checkpoints": sorted({r["checkpoint"] for r in runs if r.get("checkpoint")}),
        "answered": sum(int(r.get("answered") or 0) for r in runs),
        "replayed": replayed,
        "not_replayed_other_checkpoint": sum(int(r.get("not_replayed_other_checkpoint") or 0) for r in runs),
    }


def _prompt_tokens(job_dir: Path) -> dict[str, float] | None:
    """The builtin server's prompt tokens, those it computed and those its prefix cache served (its exit line)."""
    from ckpteval.invocation.jobdir import JobDir
    from ckpteval.server.serve import read_prompt_summary

    try:
        log = (job_dir / JobDir.DEPLOYMENT_LOG).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return read_prompt_summary(log)


def _judge(
    submitted: Mapping[str, Any] | None,
    endpoint: Mapping[str, Any],
    tasks: Mapping[str, Mapping[str, Any]],
    job_dir: Path | None = None,
) -> dict[str, Any] | None:
    """The judge as job.yaml names it, with what was verified of it and the settings each task sent it.

    The evaluated model judging itself is the endpoint whose identity the job verified; a judge deployed beside
    the model is its own deployment, with the identity the job verified it reports (`state/judge_identity`) and
    what its server loaded (`state/judge_served_checkpoint.json`); an API judge is named by its URL and model
    id, which each judged task checked (`/v1/models`) before its harness sent anything: a task whose check
    failed never ran."""
    if not submitted:
        return None
    out = dict(submitted)
    if out.get("kind") == "self":
        out["verified"] = bool(endpoint.get("verified"))
        out["identity"] = endpoint.get("identity")
    elif out.get("kind") == "deployed":
        from ckpteval.job.roles import JUDGE, role

        judge_role = role(JUDGE)
        identity = ""
        if job_dir is not None:
            try:
                identity = (job_dir / judge_role.identity_file).read_text(encoding="utf-8").strip()
            except OSError:
                identity = ""
        out["identity"] = identity or None
        out["verified"] = bool(identity)
        by_models = out.get("deployment") == "vllm"  # a second served model name, not a health field
        out["verified_by"] = (
            (
                "its /v1/models listed the identity the job gave it (as a served model name), and each judged "
                "task checked it again before its first request"
                if by_models
                else "its health reported the identity the job gave it, and each judged task checked it again "
                "(and its /v1/models) before its first request and on every answer"
            )
            if identity
            else NOT_VERIFIABLE
        )
        loaded = _json(job_dir / judge_role.served_file) if job_dir is not None else {}
        if loaded:
            out["served_checkpoint"] = loaded
    else:
        out["verified"] = True
        out["verified_by"] = "its /v1/models lists model_id (each judged task checked it before its first request)"
    settings = {}
    for name in out.get("tasks") or ():
        judge = ((tasks.get(name) or {}).get("settings") or {}).get("extra", {}).get("judge")
        if isinstance(judge, Mapping):
            settings[name] = {k: v for k, v in judge.items() if k not in ("url", "api_key", "api_key_name")}
    out["settings"] = settings
    return out


def _harness(submitted: Mapping[str, Any], tasks: Mapping[str, dict[str, Any]], images: bool) -> dict[str, Any]:
    """The harness's versions as recorded where its tasks ran (`ckpteval_versions.json`, written by the harness
    hook in each task's environment: its image on a cluster), else as the submitting machine had them (a job
    whose hook wrote none: an older job, a harness run through nemo-evaluator's proxy)."""
    ran = [t["versions"] for t in tasks.values() if t.get("versions")]
    where = "each task's image" if images else "this machine"
    if ran:
        versions = {k: ran[0][k] for k in (*HARNESS_PACKAGES, "python") if k in ran[0]}
        return {"where": where, "versions": versions, "versions_from": "the job (where its tasks ran)"}
    return {
        "where": where,
        "versions": {k: submitted[k] for k in HARNESS_PACKAGES if k in submitted},
        "versions_from": "the submitting machine (job.yaml)",
    }


# what the request-settings probe can and cannot see (results.json: provenance.endpoint.settings_probe.limits)
PROBE_LIMITS = (
    "probed once, before the first request, with a few requests of its own sent together in 4 rounds; it "
    "cannot see what other clients send the endpoint later. Every generation answer is checked for its prompt "
    "echoed (another request's echo setting), counted as an error and retried; another request's max_tokens, "
    "stop words or temperature applied later are not detected"
)


def _endpoint(job_dir: Path, owned: bool | None) -> dict[str, Any]:
    path = job_dir / JobDir.DEPLOYMENT_IDENTITY  # the job writes it once its health wait verified the identity
    try:
        identity = path.read_text(encoding="utf-8").strip()
    except OSError:
        identity = ""
    out: dict[str, Any] = (
        {"identity": identity, "verified": True}
        if identity
        else {"identity": None, "verified": False, "note": NOT_VERIFIABLE}
    )
    if owned is not None:
        out["owned"] = owned
    probe = _json(job_dir / JobDir.REQUEST_PROBE)
    if probe.get("verdict"):
        out["settings_probe"] = {
            "verdict": probe["verdict"],
            "reason": probe.get("reason"),
            "seconds": probe.get("seconds"),
            "left_out": probe.get("left_out") or [],
            "limits": PROBE_LIMITS,
        }
    elif owned is False:
        out["settings_probe"] = {"verdict": "not run", "reason": "no probe verdict in the job directory"}
    return out


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _task(task_dir: Path, image: str | None) -> dict[str, Any]:
    """A task's effective request settings (its harness output's config, else the run config it was given)
    and the harness's versions (lm-eval's results file)."""
    from ckpteval.tasks.repeats import REPEATS_FILE, read_repeats, run_layouts

    repeats_file = task_dir / REPEATS_FILE
    layout = run_layouts(read_repeats(repeats_file.read_text() if repeats_file.is_file() else None))[0]
    ran = _yaml(task_dir / layout.output / "results.yml")
    planned = _yaml(task_dir / layout.run_config)
    config = ran.get("config") or planned.get("config") or {}
    endpoint = ((planned.get("target") or {}).get("api_endpoint")) or {}
    out: dict[str, Any] = {
        "type": config.get("type"),
        "endpoint_type": endpoint.get("type"),
        "model_id": endpoint.get("model_id"),
        "settings": config.get("params") or {},
        "settings_from": "harness output" if ran.get("config") else "run config",
    }
    harness = _lm_eval_versions(task_dir / layout.output)
    if harness:
        out["harness"] = harness
    served = task_served(task_dir)
    if served:
        out["served"] = served
    ran_with = _json(task_dir / layout.output / VERSIONS_FILE)
    if ran_with.get("packages"):
        out["versions"] = {"python": ran_with.get("python"), **ran_with["packages"]}
    stats = _json(task_dir / layout.output / METRICS_FILE).get("response_stats") or {}
    if isinstance(stats, dict) and stats.get("echoed_count"):
        out["echoed_answers"] = int(stats["echoed_count"])
    if isinstance(stats, dict) and stats.get("without_logprobs_count"):
        out["answers_without_logprobs"] = int(stats["without_logprobs_count"])
    if image:
        out["image"] = image
    return out


def _lm_eval_versions(output: Path) -> dict[str, Any]:
    """lm-eval's own record of what ran (its newest results_*.json): versions and task versions."""
    found = sorted(output.glob("*/results_*.json")) + sorted(output.glob("results_*.json"))
    if not found:
        return {}
    try:
        data = json.loads(max(found, key=lambda p: p.stat().st_mtime).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    keys = ("lm_eval_version", "git_hash", "transformers_version")
    # nvidia-lm-eval installs as another distribution: lm-eval then records "No package metadata was found ..."
    out = {k: data[k] for k in keys if data.get(k) is not None and not str(data[k]).startswith("No package")}
    if data.get("versions"):
        out["task_versions"] = data["versions"]
    if data.get("n-shot"):
        out["n_shot"] = data["n-shot"]
    return out


def _yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _flat(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def provenance_differences(a: Provenance | None, b: Provenance | None, tasks: Sequence[str]) -> list[str]:
    """What besides the model differs between two invocations, `a` the baseline (their difference is then not
    only the model's): how the checkpoint's origin check ended, whether the endpoint was verified, the
    deployment's kind, device, dtype and prefix cache, the tokenizer, each task's request settings (`tasks`:
    those both ran) and the harness's versions. One sentence each; [] when nothing is known to differ; a side
    without provenance is said, since then nothing can be compared."""
    if a is None or b is None:
        side = "neither side" if a is None and b is None else "the baseline" if a is None else "the candidate"
        return [f"{side} records no provenance: nothing says what else differs"]
    out = _setup_differences(a, b)
    ja, jb = a.judge or {}, b.judge or {}
    judged_by = [(j.get("kind"), j.get("model_id"), j.get("url")) for j in (ja, jb)]
    if (ja or jb) and judged_by[0] != judged_by[1]:
        names = [" ".join(str(v) for v in judge if v) or "no judge" for judge in judged_by]
        out.append(f"judged by different judges ({names[0]} vs {names[1]})")
    ta, tb = (p.tokenizer or {} for p in (a, b))
    key = "served_sha256" if ta.get("served_sha256") and tb.get("served_sha256") else "sha256"
    if ta.get(key) and tb.get(key) and ta[key] != tb[key]:
        out.append(f"the tokenizer differs ({ta.get('origin')} {ta[key][:12]} vs {tb.get('origin')} {tb[key][:12]})")
    va, vb = a.harness.get("versions") or {}, b.harness.get("versions") or {}
    for name in sorted(set(va) & set(vb)):
        if va[name] != vb[name]:
            out.append(f"{name} differs ({va[name]} vs {vb[name]})")
    for task in tasks:
        x, y = a.tasks.get(task), b.tasks.get(task)
        if not x or not y:
            continue
        sx, sy = _flat(x.get("settings") or {}), _flat(y.get("settings") or {})
        changed = [
            f"{k}: {sx.get(k)!r} vs {sy.get(k)!r}"
            for k in sorted(set(sx) | set(sy))
            if k not in _TRANSPORT and sx.get(k) != sy.get(k)
        ]
        if x.get("endpoint_type") != y.get("endpoint_type"):
            changed.insert(0, f"endpoint: {x.get('endpoint_type')} vs {y.get('endpoint_type')}")
        if changed:
            out.append(f"{task}'s request settings differ ({'; '.join(changed)})")
        hx, hy = x.get("harness") or {}, y.get("harness") or {}
        for name in ("lm_eval_version", "git_hash", "task_versions"):
            if hx.get(name) and hy.get(name) and hx[name] != hy[name]:
                out.append(f"{task}'s harness {name} differs ({hx[name]} vs {hy[name]})")
        if x.get("image") and y.get("image") and x["image"] != y["image"]:
            out.append(f"{task}'s harness image differs ({x['image']} vs {y['image']})")
    return out


def _origin_verdict(p: Provenance) -> str:
    origin = p.origin or {}
    if not origin:
        return "not checked"
    if origin.get("mismatch_ignored"):
        return f"mismatch with {origin.get('origin')} ignored"
    return "disagrees" if origin.get("disagreements") else f"agrees with {origin.get('origin')}"


def _setup_differences(a: Provenance, b: Provenance) -> list[str]:
    """How the two were served, where it differs: origin check, endpoint verification, deployment."""
    out = []
    oa, ob = _origin_verdict(a), _origin_verdict(b)
    if oa != ob:
        out.append(f"the origin check differs ({oa} vs {ob})")
    va, vb = (bool((p.endpoint or {}).get("verified")) for p in (a, b))
    if va != vb:
        words = {True: "verified", False: "not verified"}
        out.append(f"the endpoint's identity differs ({words[va]} vs {words[vb]})")
    da, db = a.deployment or {}, b.deployment or {}
    if da.get("kind") != db.get("kind"):
        out.append(f"the deployment kind differs ({da.get('kind')} vs {db.get('kind')})")
    sa, sb = da.get("serving") or {}, db.get("serving") or {}
    for key, name in (("device", "device"), ("dtype", "dtype"), ("prefix_cache", "prefix cache")):
        if sa.get(key) != sb.get(key):
            out.append(f"the deployment's {name} differs ({_word(sa.get(key))} vs {_word(sb.get(key))})")
    return out


def _word(value: Any) -> str:
    return "not recorded" if value is None else {True: "on", False: "off"}.get(value, str(value))


def provenance_summary(provenance: Provenance | None, task: str | None = None) -> dict[str, str]:
    """A few flat lines for places that show metadata as text (MLflow params, the report, Inspect logs): the
    checkpoint's identity, tokenizer, origin check, deployment, endpoint identity, harness versions, and with
    `task` that task's request settings."""
    if provenance is None:
        return {}
    p = provenance
    out: dict[str, str] = {}
    if p.checkpoint:
        c = p.checkpoint
        where = f"{c.get('layout')} {c.get('format')} iteration {c.get('iteration')}"
        meta = (c.get("metadata_sha256") or "-")[:12]
        if c.get("source") == "server":
            out["checkpoint"] = f"{where} as served; metadata {meta}, content {(c.get('files_sha256') or '-')[:12]}"
        elif c.get("source") == EXPORT_STEP:
            served_as = c.get("served_as") or {}
            parity = served_as.get("parity") or {}
            verdict = "passed" if parity.get("passed") else "NOT PASSED"
            out["checkpoint"] = (
                f"{where} as exported; metadata {meta}, content {(c.get('files_sha256') or '-')[:12]}, served as "
                f"export {(served_as.get('cache_key') or '-')[:12]} ({served_as.get('dtype')}), parity {verdict}"
            )
        else:
            out["checkpoint"] = f"{where} as described before the job (not reported by the server); metadata {meta}"
        if c.get("unexpected_tensors"):
            out["checkpoint"] += f"; UNEXPECTED TENSORS, served without: {'; '.join(c['unexpected_tensors'])}"
    else:
        out["checkpoint"] = "not inspected before the job (prepared by it)"
    if p.tokenizer:
        out["tokenizer"] = f"{p.tokenizer.get('kind')} {(p.tokenizer.get('sha256') or '-')[:12]}"
    if p.origin:
        disagreements = p.origin.get("disagreements") or []
        verdict = f"DISAGREES, run anyway: {'; '.join(disagreements)}" if disagreements else "agrees"
        skipped = p.origin.get("not_compared") or []
        verdict += f" (not compared: {'; '.join(skipped)})" if skipped else ""
        out["origin"] = f"{p.origin.get('origin')}: {verdict}"
    deployment = " ".join(str(v) for v in (p.deployment.get("kind"), p.deployment.get("image")) if v)
    if deployment:
        out["deployment"] = deployment
    out["endpoint"] = p.endpoint.get("identity") or p.endpoint.get("note") or NOT_VERIFIABLE
    if p.judge:
        out["judge"] = " ".join(str(v) for v in (p.judge.get("kind"), p.judge.get("model_id"), p.judge.get("url")) if v)
    probe = p.endpoint.get("settings_probe") or {}
    if probe.get("verdict"):
        out["settings probe"] = f"{probe['verdict']}: {probe.get('reason') or ''}".rstrip(": ")
    versions = p.harness.get("versions") or {}
    if versions:
        where = f" ({p.harness['versions_from']})" if p.harness.get("versions_from") else ""
        out["harness"] = ", ".join(f"{k} {v}" for k, v in versions.items()) + where
    if task and task in p.tasks:
        settings = _flat(p.tasks[task].get("settings") or {})
        out["settings"] = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()) if k not in _TRANSPORT)
    return out
