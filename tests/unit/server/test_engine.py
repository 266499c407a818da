"""The model runner itself, in this process: the serving dtype, and rows joining a running generation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckpteval.server.engine import GenerationBatch, SamplingParams
from tests.deploy_support import greedy_directly


def test_every_parameter_is_in_the_serving_dtype(tiny_checkpoint: Path, tiny_loaded: Any) -> None:
    import torch

    from ckpteval.server.packaged import megatron_logits
    from ckpteval.server.serve import load_model

    bf16 = load_model(tiny_checkpoint, device="cpu", dtype="bfloat16")
    dtypes = {name: p.dtype for name, p in bf16.runner.model.named_parameters()}
    assert set(dtypes.values()) == {torch.bfloat16}, dtypes
    assert any("layernorm" in name or "layer_norm" in name for name in dtypes)  # the norms are there too
    ids = torch.tensor([tiny_loaded.runner.tokenizer.encode("The serving dtype, end to end.")])
    exact = megatron_logits(tiny_loaded.runner.model, ids).float()
    ours = megatron_logits(bf16.runner.model, ids).float()
    # bf16 rounding (8 bits of mantissa) through the layers, nothing more: small on average, same choices
    error = float((ours - exact).abs().mean()) / float(exact.abs().mean())
    agree = float((ours.argmax(-1) == exact.argmax(-1)).float().mean())
    print(f"bf16 vs fp32: mean relative error {error:.4f}, argmax agreement {agree:.2f}")
    assert error < 0.05 and agree >= 0.8
    # the server's scoring path in bf16
    rows = bf16.runner.score([ids[0].tolist()])[0].token_logprobs
    expected = tiny_loaded.runner.score([ids[0].tolist()])[0].token_logprobs
    assert sum(abs(a - b) for a, b in zip(rows, expected, strict=True)) / len(rows) < 0.05


def _run(batch: GenerationBatch, results: dict[int, Any], steps: int | None = None) -> None:
    while not batch.done and (steps is None or steps > 0):
        results.update(batch.step())
        steps = None if steps is None else steps - 1


@pytest.mark.parametrize("late_prompt", ["short", "a prompt longer than the running batch has generated so far"])
def test_a_late_row_joins_the_running_batch_and_generates_as_alone(tiny_loaded: Any, late_prompt: str) -> None:
    runner = tiny_loaded.runner
    tokenizer = runner.tokenizer
    early = [tokenizer.encode("Once upon a time"), tokenizer.encode("xy")]
    late = tokenizer.encode(late_prompt)
    params = [SamplingParams(max_tokens=30), SamplingParams(max_tokens=12)]
    running = GenerationBatch(runner, list(zip(early, params, strict=True)), tags=[10, 11])
    results: dict[int, Any] = {}
    _run(running, results, steps=6)  # prompt forward + 5 decode steps
    assert not running.done
    joining = GenerationBatch(runner, [(late, SamplingParams(max_tokens=20))], tags=[12])
    results.update(joining.step())
    running.join(joining)
    assert len(running.rows) == 3 and joining.done
    _run(running, results)
    for tag, prompt, n in ((10, early[0], 30), (11, early[1], 12), (12, late, 20)):
        assert results[tag].token_ids == greedy_directly(runner.model, prompt, n, tokenizer.stop_token_ids), tag


def test_a_batch_fed_for_long_keeps_its_cache_bounded(tiny_loaded: Any) -> None:
    """Rows keep joining while others leave: the cache front that no row uses any more is dropped."""
    runner = tiny_loaded.runner
    prompt = runner.tokenizer.encode("abc")
    params = SamplingParams(max_tokens=8)
    running = GenerationBatch(runner, [(prompt, params)], tags=[0])
    results: dict[int, Any] = {}
    _run(running, results, steps=1)
    for tag in range(1, 12):  # a new row every 4 steps; each lives 8 steps
        joining = GenerationBatch(runner, [(prompt, params)], tags=[tag])
        results.update(joining.step())
        running.join(joining)
        _run(running, results, steps=4)
    _run(running, results)
    expected = greedy_directly(runner.model, prompt, 8, runner.tokenizer.stop_token_ids)
    assert all(results[tag].token_ids == expected for tag in range(12))
    # 12 rows x 8 tokens went through; never more than a few rows' worth of slots at once
    assert running.capacity < 3 * (len(prompt) + 8) + 4 * 3
