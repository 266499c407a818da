"""Every corpus checkpoint: described correctly by `evaluate inspect` (a test per row), served by the builtin
(sharded saves with the TP=1 save's log-probabilities), and `evaluate` end to end, a log-likelihood task and a
generation task, on the one that changes the most of the pipeline: a SentencePiece tokenizer named only in its
args (the server converts and publishes it, the clients read it) on a TP=2 save (resharded at load). The
other architectures are served in-process here and matched to transformers in tests/unit/deploy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
runner = CliRunner()

# name -> (layout, family starts with, saved "TP PP EP", tokenizer kind)
EXPECTED: dict[str, tuple[str, str, str, str]] = {
    "llama3": ("megatron-lm", "Llama-style GPT", "1 1 1", "HuggingFaceTokenizer"),
    "qwen2": ("megatron-lm", "Llama-style GPT", "1 1 1", "HuggingFaceTokenizer"),
    "qwen3": ("megatron-lm", "Llama-style GPT", "1 1 1", "HuggingFaceTokenizer"),
    "mistral_window": ("megatron-lm", "Llama-style GPT", "1 1 1", "HuggingFaceTokenizer"),
    "mixtral_moe": ("megatron-lm", "Llama-style GPT MoE (4 experts, top-2)", "1 1 1", "HuggingFaceTokenizer"),
    "qwen3_moe": ("megatron-lm", "Llama-style GPT MoE", "1 1 1", "HuggingFaceTokenizer"),
    "nemotron4": ("megatron-lm", "Nemotron-4", "1 1 1", "HuggingFaceTokenizer"),
    "tp1": ("megatron-lm", "Llama-style GPT", "1 1 1", "HuggingFaceTokenizer"),
    "tp2": ("megatron-lm", "Llama-style GPT", "2 1 1", "HuggingFaceTokenizer"),
    "pp2": ("megatron-lm", "Llama-style GPT", "1 2 1", "HuggingFaceTokenizer"),
    "legacy_tp1": ("megatron-lm", "Llama-style GPT", "1 1 1", "HuggingFaceTokenizer"),
    "tokenizer-GPT2BPETokenizer": ("megatron-lm", "Llama-style GPT", "1 1 1", "GPT2BPETokenizer"),
    "tokenizer-SentencePieceTokenizer": ("megatron-lm", "Llama-style GPT", "1 1 1", "SentencePieceTokenizer"),
    "tokenizer-GPTSentencePieceTokenizer": ("megatron-lm", "Llama-style GPT", "1 1 1", "GPTSentencePieceTokenizer"),
    "tokenizer-Llama2Tokenizer": ("megatron-lm", "Llama-style GPT", "1 1 1", "Llama2Tokenizer"),
    "tokenizer-TikTokenizer": ("megatron-lm", "Llama-style GPT", "1 1 1", "TikTokenizer"),
    "tokenizer-HuggingFaceTokenizer": ("megatron-lm", "Llama-style GPT", "1 1 1", "HuggingFaceTokenizer"),
    "tokenizer-Llama2Tokenizer-tp2": ("megatron-lm", "Llama-style GPT", "2 1 1", "Llama2Tokenizer"),
    "bridge": ("megatron-bridge", "Llama-style GPT", "1 1 1", "HuggingFaceTokenizer"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_inspect_describes_the_checkpoint(corpus: dict[str, Path], name: str) -> None:
    layout, family, saved, tokenizer = EXPECTED[name]
    result = runner.invoke(app, ["inspect", str(corpus[name]), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["layout"] == layout and data["family"].startswith(family), data["family"]
    parallel = data["saved_parallelism"]
    assert f"{parallel['tensor']} {parallel['pipeline']} {parallel['expert']}" == saved
    assert data["tokenizer"]["kind"] == tokenizer and data["tokenizer"]["problem"] is None, data["tokenizer"]
    verdicts = {v["backend"]: v["can_serve"] for v in data["backends"]}
    # every corpus architecture has a Hugging Face family: vLLM and SGLang serve it through the job's export
    assert verdicts == {"builtin-cpu": True, "builtin-gpu": True, "export-deploy": True, "vllm": True, "sglang": True}
    assert data["format"] == ("torch" if name.startswith("legacy") else "torch_dist")
    assert data["parameters"] > 0 and data["weight_bytes"] >= 2 * data["parameters"]
    if name == "bridge":
        assert data["hf_model_id"] == "meta-llama/Llama-3.2-1B"


@pytest.fixture(scope="module")
def served(corpus: dict[str, Path]) -> dict[str, Any]:
    """Each checkpoint loaded by the builtin server's own loader, in this process (megatron imported once)."""
    from ckpteval.server.serve import load_model

    return {name: load_model(path, device="cpu") for name, path in corpus.items()}


def test_the_builtin_serves_every_corpus_checkpoint(served: dict[str, Any]) -> None:
    import math

    for name, loaded in served.items():
        ids = loaded.runner.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
        [row] = loaded.runner.score([ids])
        assert all(math.isfinite(x) for x in row.token_logprobs[1:]), name


def test_sharded_saves_serve_the_tp1_log_probabilities(served: dict[str, Any]) -> None:
    ids = served["tp1"].runner.tokenizer.encode("Megatron checkpoints saved with TP=2 and PP=2.")
    [reference] = served["tp1"].runner.score([ids])
    for name in ("tp2", "pp2", "legacy_tp1"):
        [row] = served[name].runner.score([ids])
        assert max(abs(a - b) for a, b in zip(row.token_logprobs[1:], reference.token_logprobs[1:], strict=True)) < 1e-5


def test_the_server_tokenizes_like_megatrons_own_tokenizer_classes(
    corpus: dict[str, Path], served: dict[str, Any]
) -> None:
    """The tokenizer the server converted from the files a checkpoint's args name (and publishes for the task
    clients) gives the ids megatron.core.tokenizers gives for the same args. (GPT-2 BPE needs megatron's
    hub "gpt2" entry: its parity is proven in tests/unit/checkpoint/test_tokenizer_source.py.)"""
    import subprocess
    import sys

    from ckpteval.checkpoint.torchfiles import read_torch_save
    from tests.support.megatron_tokenizers import DEFAULT_ARGS

    texts = ["Hello world", "  two  spaces\tand a tab\n", "日本語 emoji 😀 café", "the model answer."]
    kinds = ("Llama2Tokenizer", "GPTSentencePieceTokenizer", "TikTokenizer")
    request: dict[str, Any] = {"texts": texts, "tokenizers": {}}
    for kind in kinds:
        args = read_torch_save(corpus[f"tokenizer-{kind}"] / "iter_0000000" / "common.pt")["args"]
        request["tokenizers"][kind] = {k: getattr(args, k) for k in DEFAULT_ARGS if hasattr(args, k)}
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.megatron_tokenizers"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        cwd=repo,
        check=True,
    )
    expected = json.loads(done.stdout)
    for kind in kinds:
        ours = [served[f"tokenizer-{kind}"].runner.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        assert ours == expected[kind]["ids"], kind


def _evaluate(checkpoint: Path, workdir: Path, *extra: str) -> Any:
    import subprocess
    import sys

    argv = [
        sys.executable,
        "-m",
        "ckpteval.cli",
        "-c",
        "tiny",
        "-t",
        "hellaswag",
        "-t",
        "adlr_humaneval_greedy",
        "deployment.prepare=null",
        f"run.model={checkpoint}",
        "evaluation.nemo_evaluator_config.config.params.limit_samples=2",
        "evaluation.nemo_evaluator_config.config.params.max_new_tokens=8",
        *extra,
    ]
    return subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=900)


@pytest.mark.long  # 2.4 min: the corpus checkpoints are served and scored in-process above
@pytest.mark.parametrize("name", ["tokenizer-Llama2Tokenizer-tp2"])
def test_evaluate_end_to_end(corpus: dict[str, Path], tmp_path: Path, name: str) -> None:
    done = _evaluate(corpus[name], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [results] = list(tmp_path.glob("results/*/results.json"))
    tasks = json.loads(results.read_text())["tasks"]
    assert tasks["hellaswag"]["status"] == "succeeded" and tasks["adlr_humaneval_greedy"]["status"] == "succeeded"
    assert tasks["hellaswag"]["n_samples"] == 2
    published = next(tmp_path.glob("results/*/tokenizer"))
    assert (published / "tokenizer.json").is_file()  # what the clients read: the server's own tokenizer
