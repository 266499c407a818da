"""Tasks grouped by the settings their requests carry, from the compiled config to the plan: which groups,
when the job probes the endpoint, and where the deployment is known to mix settings (Export-Deploy 0.5+)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.deploy.export_deploy import DEFAULT_ENTRY_POINT, MLM_FLAGS, mixes_settings
from ckpteval.job.build import Toolchain, build_plan
from ckpteval.job.request_groups import request_groups_panel
from ckpteval.job.script import render_job_script

TOOLCHAIN = Toolchain(python="python3", evaluator="nemo-evaluator", hook_dir="/hook")
PROFILE = """
[CLUSTER]
executor = "slurm"
host = "login.cluster.invalid"
account = "llm"
partition = "batch"
remote_job_dir = "/lustre/me/ckpteval"
container_image = "nvcr.io/nvidia/nemo:25.11"
"""


def _plan(tmp_path: Path, tasks: tuple[str, ...], *overrides: str, profile: str | None = None):
    request = CompileRequest(
        configs=("sft" if profile else "tiny",),
        tasks=tasks,
        overrides=overrides,
        profile=profile,
        mode="run" if profile else "local",
    )
    compiled = compile_config(request)
    launcher = "srun-containers" if profile else "processes"
    plan = build_plan(compiled, invocation="i", job_dir=str(tmp_path), toolchain=TOOLCHAIN, launcher=launcher)
    return compiled, plan


def test_log_likelihood_tasks_share_a_group_each_generation_task_has_its_own(isolated_user: Path, tmp_path: Path):
    _, plan = _plan(tmp_path, ("hellaswag", "gsm8k", "arc_challenge", "adlr_mmlu"))
    requests = plan.requests
    assert requests is not None
    assert requests.groups == ((0, 2), (1,), (3,))  # first appearance first
    assert requests.words[0].startswith("log-likelihood (echo, logprobs, max_tokens 1")
    assert requests.words[1].startswith("gsm8k's generations (temperature 1e-07")
    assert requests.known_mixing == ""  # the builtin server answers each request with its own settings
    argv = shlex.split(requests.probe)
    assert argv[:2] == ["python3", "/hook/ckpteval_settings_probe.py"]
    # on the port the builtin server publishes when it starts (the job expands it)
    assert argv[argv.index("--completions") + 1] == "http://127.0.0.1:${DEPLOY_PORT}/v1/completions/"
    assert '--completions "http://127.0.0.1:${DEPLOY_PORT}/v1/completions/"' in requests.probe
    assert argv[argv.index("--out") + 1] == str(tmp_path / "state/request_probe.json")
    script = render_job_script(plan)
    assert "run_tasks task_0 task_2 task_1 task_3" in script  # group by group
    panel = request_groups_panel(plan)
    assert panel is not None and "group 1: hellaswag, arc_challenge" in panel.body
    assert "the job probes the endpoint" in panel.body


def test_no_probe_where_grouping_changes_nothing(isolated_user: Path, tmp_path: Path):
    _, alike = _plan(tmp_path, ("hellaswag", "arc_challenge"))  # every request alike
    assert alike.requests is not None and alike.requests.probe == "" and len(alike.requests.groups) == 1
    _, one_at_a_time = _plan(tmp_path, ("hellaswag", "gsm8k"), "evaluation.max_parallel_tasks=1")
    assert one_at_a_time.requests is not None and one_at_a_time.requests.probe == ""
    for plan in (alike, one_at_a_time):
        script = render_job_script(plan)
        assert "settle_requests" not in script and "CKPTEVAL_REQUEST_TURN" not in script


def test_an_endpoint_that_runs_already_is_probed_where_the_config_points(isolated_user: Path, tmp_path: Path):
    url = "http://10.0.0.5:9000/v1/completions"
    _, plan = _plan(
        tmp_path, ("hellaswag", "gsm8k"), "deployment=none", f"target.api_endpoint.url={url}", "deployment.tokenizer=/t"
    )
    assert plan.requests is not None
    argv = shlex.split(plan.requests.probe)
    assert argv[argv.index("--completions") + 1] == url
    script = render_job_script(plan)
    assert 'until [ "$(cat state/deployment' not in script  # nothing to wait for: probe at once
    assert "settle_requests &" in script


def test_export_deploy_0_5_is_known_to_mix_settings_0_4_is_not(isolated_user: Path, tmp_path: Path, write_env):
    from ckpteval.cluster.export_deploy import with_entry_point

    assert "--batch_wait_timeout_s (Export-Deploy 0.5+)" in mixes_settings(DEFAULT_ENTRY_POINT)
    v04 = dataclasses.replace(DEFAULT_ENTRY_POINT, flags=MLM_FLAGS - {"--batch_wait_timeout_s"})
    assert mixes_settings(v04) == ""

    write_env(PROFILE)
    compiled, plan = _plan(
        tmp_path, ("hellaswag", "gsm8k"), "run.model=/ckpt", "export.wandb.enabled=false", profile="CLUSTER"
    )
    assert plan.deployment.kind == "megatron/export-deploy"
    assert plan.requests is not None and plan.requests.known_mixing == mixes_settings(DEFAULT_ENTRY_POINT)
    assert "why='deploy_ray.py takes --batch_wait_timeout_s" in render_job_script(plan, launcher="srun-containers")
    probed_04 = with_entry_point(plan, compiled, v04)  # what a probe of a 0.4 image finds
    assert probed_04.requests is not None and probed_04.requests.known_mixing == ""
    assert with_entry_point(probed_04, compiled, DEFAULT_ENTRY_POINT).requests == plan.requests


def test_an_endpoint_the_job_does_not_own_is_probed_whatever_its_tasks(isolated_user: Path, tmp_path: Path):
    """One task, one request group: nothing of this invocation's could mix, but another invocation on the same
    endpoint can. The job probes it anyway, and job.yaml says the endpoint is not the job's own."""
    import yaml

    from ckpteval.job.files import job_files

    url = "http://10.0.0.5:9000/v1/completions"
    compiled, plan = _plan(
        tmp_path, ("hellaswag",), "deployment=none", f"target.api_endpoint.url={url}", "deployment.tokenizer=/t"
    )
    assert plan.requests is not None and plan.requests.shared and len(plan.requests.groups) == 1
    argv = shlex.split(plan.requests.probe)
    assert argv[argv.index("--completions") + 1] == url
    script = render_job_script(plan)
    assert "settle_requests &" in script and "CKPTEVAL_REQUEST_TURN" in script  # the task waits for the probe
    assert "one group of identical request settings (a shared endpoint): $line" in script
    panel = request_groups_panel(plan)
    assert panel is not None and "The job does not own this endpoint" in panel.body
    recorded = yaml.safe_load(job_files(compiled, plan, launcher="processes")["job.yaml"])
    assert recorded["deployment"]["endpoint_owned"] is False

    # the job's own builtin server, one task: no probe, nothing waits
    compiled, own = _plan(tmp_path, ("hellaswag",))
    assert own.requests is not None and own.requests.probe == "" and not own.requests.shared
    assert yaml.safe_load(job_files(compiled, own, launcher="processes")["job.yaml"])["deployment"]["endpoint_owned"]
