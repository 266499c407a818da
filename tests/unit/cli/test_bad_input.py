"""The table of bad inputs: each gets one clear message naming the fix, a non-zero exit, no traceback,
and nothing written (no results dir, no invocation record)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app

runner = CliRunner()

ENV = """
[cluster]
host = "login.example.com"
account = "acct"
remote_job_dir = "/lustre/me"

[loop]
extends = "loop2"
[loop2]
extends = "loop"

[orphan]
extends = "missing"
"""

CASES = [
    # (id, argv, env.toml text or None, expected message fragment, expected hint fragment)
    ("malformed-toml", ["-c", "tiny", "--run", "x", "-d"], "[x\n", "is not valid TOML", ""),
    (
        "unknown-profile",
        ["-c", "tiny", "--run", "clustr", "-d"],
        ENV,
        "Unknown profile 'clustr'",
        "Profiles that exist: cluster, local, loop, loop2, orphan",
    ),
    ("extends-cycle", ["-c", "tiny", "--run", "loop", "-d"], ENV, "cycle: loop -> loop2 -> loop", ""),
    ("extends-missing", ["-c", "tiny", "--run", "orphan", "-d"], ENV, "extends 'missing', which does not exist", ""),
    (
        "unknown-config",
        ["-c", "sfft", "-d"],
        None,
        "Unknown config 'sfft'. Did you mean 'sft'",
        "Configs that exist: chat, pretrain, rl, sft, tiny",
    ),
    ("missing-config-file", ["-c", "./nope.yaml", "-d"], None, "Config file ./nope.yaml does not exist", ""),
    # as root nothing is unreadable by permissions; a file whose read fails (EIO) stands in for it
    (
        "unreadable-config-file",
        ["-c", "./secret.yaml", "-d"],
        None,
        "Cannot read" if os.geteuid() == 0 else "is not readable",
        "" if os.geteuid() == 0 else "chmod",
    ),
    ("malformed-override", ["-c", "tiny", "-d", "evaluation.tasks=[1,2"], None, "Malformed override", "key=value"),
    (
        "override-unknown-key",
        ["-c", "tiny", "-d", "evaluation.nope=1"],
        None,
        "Cannot override 'evaluation.nope': the config has no such key",
        "+evaluation.nope=1",
    ),
    ("unknown-task", ["-c", "tiny", "-d", "-t", "helaswag"], None, "Unknown task 'helaswag'", "hellaswag"),
    ("run-and-batch", ["-c", "tiny", "--run", "a", "--batch", "b", "-d"], None, "mutually exclusive", ""),
    (
        "type-error",
        ["-c", "tiny", "-d", "evaluation.nemo_evaluator_config.config.params.parallelism=lots"],
        None,
        "'evaluation.nemo_evaluator_config.config.params.parallelism' must be an integer, not 'lots'",
        "",
    ),
    (
        "missing-required",
        ["-c", "tiny", "-d", "deployment=generic"],
        None,
        "'deployment.image' is required but has no value",
        "deployment.image=VALUE",
    ),
    (
        "unresolvable-interpolation",
        ["-c", "tiny", "-d", "run.name=${nothing.here}"],
        None,
        "Cannot resolve 'run.name'",
        "",
    ),
    (
        "unknown-group-option",
        ["-c", "tiny", "-d", "deployment=vlm"],
        None,
        "Unknown deployment 'vlm'",
        "deployment=vllm",
    ),
    ("no-model", ["-c", "sft", "-d"], None, "run.model is not set", "run.model=/path/to/checkpoint"),
    (
        "missing-checkpoint",
        ["-c", "sft", "-d", "run.model=/no/such/ckpt"],
        None,
        "Checkpoint /no/such/ckpt does not exist",
        "evaluate prepare",
    ),
    (  # the tiny config prepares SmolLM2, but only into ckpteval's cache: a typo is a typo, never SmolLM2
        "missing-checkpoint-under-tiny",
        ["-c", "tiny", "-d", "run.model=/tmp/typo/my-ckpt"],
        None,
        "Checkpoint /tmp/typo/my-ckpt does not exist",
        "run.model=",
    ),
    (
        "logprobs-on-chat",
        ["-c", "pretrain", "-d", "run.model=.", "+evaluation.tasks.1.endpoint_type=chat"],
        None,
        "supports completions endpoints, not 'chat'",
        "endpoint_type=completions",
    ),
    (
        "logprobs-without-tokenizer",
        ["-c", "pretrain", "-d", "deployment=none", "target.api_endpoint.url=http://127.0.0.1:9/v1/completions"],
        None,
        "log-likelihood tasks need the model's tokenizer",
        "deployment.tokenizer",
    ),
    (
        "judged-task-without-a-judge",
        ["-c", "tiny", "-d", "-t", "mtbench"],
        None,
        "mtbench is scored by a judge model and no judge is set: add judge=api",
        "",
    ),
    (
        "wandb-without-project",
        ["-c", "tiny", "-d", "export.wandb.enabled=true"],
        None,
        "export.wandb is enabled but no W&B project is set",
        "env.toml [wandb]",
    ),
    ("none-without-url", ["-c", "tiny", "-d", "deployment=none"], None, "no URL is set", "target.api_endpoint.url="),
    (
        "tp-on-builtin",
        ["-c", "tiny", "-d", "deployment.tensor_model_parallel_size=2"],
        None,
        "builtin server runs on one device",
        "export-deploy",
    ),
    ("no-replicas", ["-c", "tiny", "-d", "deployment.num_replicas=0"], None, "num_replicas must be at least 1", ""),
    (
        "json-dry-run",
        ["-c", "tiny", "--json", "-d"],
        None,
        "--json goes with a run that ends with results, not with --dry-run",
        "evaluate results ID --json",
    ),
]


@pytest.mark.parametrize(("argv", "env", "message", "hint"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(isolated_user: Path, write_env, argv, env, message, hint):
    if env is not None:
        write_env(env)
    secret = isolated_user / "secret.yaml"
    if os.geteuid() == 0:
        secret.symlink_to("/proc/self/mem")
    else:
        secret.write_text("run: {}\n")
        secret.chmod(0)
    before = sorted(p.name for p in isolated_user.iterdir())
    result = runner.invoke(app, argv)
    output = result.output
    assert result.exit_code != 0, output
    assert message in output, output
    assert hint in output, output
    assert "Traceback" not in output
    assert sorted(p.name for p in isolated_user.iterdir()) == before  # nothing written
    assert not (Path(os.environ["XDG_STATE_HOME"]) / "ckpteval").exists()
