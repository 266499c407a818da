"""A checkpoint its backend cannot serve is refused on a Slurm profile before anything happens there: the
checkpoint's small files are read over SSH (one round trip), the message says what and why, nothing is
recorded or submitted, and no remote directory is made."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.invocation.record import list_records
from tests.integration.slurm_jobs import free_port
from tests.support.corpus.edit import make_world_readable, with_args

pytestmark = pytest.mark.slurm
runner = CliRunner()


def cli(*argv: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(argv))
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture(scope="module")
def shared_checkpoints(tiny_checkpoint: str) -> dict[str, Path]:
    """The tiny checkpoint as saved, and copies whose args make it unservable by the builtin, readable by
    the cluster's user."""
    base = Path("/tmp") / f"ckpteval-refusals-{os.getpid()}"
    base.mkdir(exist_ok=True)
    tiny = Path(tiny_checkpoint)
    out = {
        "tiny": tiny,
        "hybrid": with_args(tiny, base / "hybrid", hybrid_override_pattern="M*"),
        "null-tokenizer": with_args(tiny, base / "null-tokenizer", tokenizer_type="NullTokenizer"),
    }
    # the null-tokenizer copy must not fall back to the tokenizer/ directory beside it
    import shutil

    shutil.rmtree(out["null-tokenizer"] / "tokenizer")
    make_world_readable(base)
    return out


def _args(env: Path, checkpoint: Path, *extra: str) -> list[str]:
    own = () if any(e.startswith("deployment=") for e in extra) else ("deployment.prepare=null",)
    return [
        "-c",
        "tiny",
        "--env-file",
        str(env),
        "-t",
        "adlr_humaneval_greedy",
        *own,
        f"run.model={checkpoint}",
        f"deployment.port={free_port()}",
        *extra,
    ]


@pytest.mark.parametrize(
    ("checkpoint", "extra", "message"),
    [
        ("hybrid", (), "hybrid Mamba"),
        ("null-tokenizer", (), "NullTokenizer"),
        (
            "hybrid",
            ("deployment=vllm", "deployment.image=vllm/vllm-openai:v0.8.5"),
            "vLLM and SGLang serve Hugging Face directories, not this Megatron checkpoint; export-hf: no",
        ),
    ],
    ids=["hybrid-mamba-on-builtin", "null-tokenizer", "vllm-on-a-megatron-checkpoint-no-export-computes"],
)
def test_an_unservable_checkpoint_is_refused_before_anything_is_submitted(  # type: ignore[no-untyped-def]
    shared_checkpoints, write_env_toml, remote_job_dir, checkpoint, extra, message
):
    env = write_env_toml("CI", python=str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"))
    result = cli(*_args(env, shared_checkpoints[checkpoint], *extra), "--batch", "CI")
    assert result.exit_code != 0, result.output
    text = " ".join(result.output.split())
    assert message in text, text
    assert "cannot serve" in text, text
    assert list_records() == []  # nothing recorded, so nothing submitted
    assert not os.path.exists(remote_job_dir)  # no remote directory made


def test_dry_run_with_check_describes_the_checkpoint_on_the_cluster(  # type: ignore[no-untyped-def]
    shared_checkpoints, write_env_toml, remote_job_dir, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "300")
    env = write_env_toml("CI", python=str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"))
    result = cli(
        *_args(env, shared_checkpoints["tiny"], "deployment.backend=builtin"), "--run", "CI", "--dry-run", "--check"
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "served by builtin-gpu" in text, text
    assert "Llama-style GPT" in text and "saved with TP=1 PP=1 EP=1" in text, text
    assert str(shared_checkpoints["tiny"]) in text  # the cluster's path, not where its files were copied
    assert list_records() == [] and not os.path.exists(remote_job_dir)


def test_inspect_reads_a_cluster_checkpoint_over_ssh(shared_checkpoints, write_env_toml):  # type: ignore[no-untyped-def]
    import json

    env = write_env_toml("CI")
    result = cli("inspect", str(shared_checkpoints["hybrid"]), "--run", "CI", "--env-file", str(env), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["family"].startswith("hybrid Mamba") and data["path"].startswith(str(shared_checkpoints["hybrid"]))
    verdicts = {v["backend"]: v for v in data["backends"]}
    assert not verdicts["builtin-gpu"]["can_serve"] and verdicts["export-deploy"]["can_serve"]
    missing = cli("inspect", "/nonexistent/ckpt", "--run", "CI", "--env-file", str(env))
    assert missing.exit_code == 1 and "does not exist on" in missing.output
