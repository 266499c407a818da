"""`check_parity`: a Hugging Face directory against the Megatron checkpoint it claims to be, before any score.

Four comparisons, each naming what differs:
- config: config.json against the checkpoint's args (`checkpoint.origin`'s comparison: layers, sizes, heads,
  RoPE base and scaling, norms, biases, tied embeddings, experts) and the sliding window;
- tensors: every tensor the checkpoint maps to (`hfexport.weights`) against the directory's, bit for bit in
  the directory's dtype; missing, extra and differing tensors are named;
- tokenizer: the directory's tokenizer gives the ids the builtin server's gives, plain and through the chat
  template;
- forward: transformers on the directory and the builtin engine on the checkpoint (the server's own
  `load_model`, in-process), both in float32 from the same weight values (the checkpoint's rounded through
  the directory's dtype), on fixed prompts: a chat turn, a short plain prompt and a long one (up to
  LONG_PROMPT_TOKENS, or the model's context): logits within TOLERANCE, greedy continuations identical.

What it does not prove: that another engine (vLLM, SGLang) computes what transformers computes on the same
directory; prompts longer than the long one; sampling.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.errors import DeploymentError

LONG_PROMPT_TOKENS = 384
NEW_TOKENS = 16
# float32 on both sides from identical weights: what differs is the order of operations (fused QKV and
# gate/up against separate projections); measured ~1e-5 on SmolLM2-135M's logits (benchmarks in docs/deploy.md)
TOLERANCE = 2e-3
CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
PLAIN = "The capital of France is"
_LONG_TEXT = (
    "Megatron checkpoints are trained with tensor and pipeline parallelism, saved as sharded tensors, and read "
    "back by resharding. A model exported to another format must compute the same function: the same rotary "
    "frequencies at every position, the same normalisation, the same projections and the same vocabulary. "
)


@dataclass(frozen=True)
class PromptResult:
    """One prompt's comparison."""

    name: str
    tokens: int
    max_abs_logit_diff: float
    greedy_megatron: tuple[int, ...]
    greedy_hf: tuple[int, ...]

    @property
    def greedy_identical(self) -> bool:
        return self.greedy_megatron == self.greedy_hf


@dataclass(frozen=True)
class ParityReport:
    """The Hugging Face directory compared with the checkpoint; `passed` only when nothing differs."""

    checkpoint: str
    hf_dir: str
    dtype: str  # of the directory's weights
    tolerance: float
    config_compared: tuple[str, ...]
    config_differences: tuple[str, ...]
    tensors_compared: int
    tensor_differences: tuple[str, ...]
    tokenizer_differences: tuple[str, ...]
    prompts: tuple[PromptResult, ...] = field(default=())

    @property
    def max_abs_logit_diff(self) -> float:
        return max((p.max_abs_logit_diff for p in self.prompts), default=float("nan"))

    @property
    def greedy_identical(self) -> bool:
        return all(p.greedy_identical for p in self.prompts)

    @property
    def differences(self) -> list[str]:
        """Everything that differs, one phrase each."""
        out = [f"config: {d}" for d in self.config_differences]
        out += [f"tensors: {d}" for d in self.tensor_differences]
        out += [f"tokenizer: {d}" for d in self.tokenizer_differences]
        for p in self.prompts:
            if not p.max_abs_logit_diff <= self.tolerance:
                out.append(f"logits: {p.name} prompt ({p.tokens} tokens) max |diff| {p.max_abs_logit_diff:.3g} > "
                           f"{self.tolerance:g}")  # fmt: skip
            if not p.greedy_identical:
                at = next(
                    (i for i, (a, b) in enumerate(zip(p.greedy_megatron, p.greedy_hf, strict=False)) if a != b),
                    min(len(p.greedy_megatron), len(p.greedy_hf)),
                )
                out.append(f"greedy: {p.name} prompt's continuations differ from token {at}")
        return out

    @property
    def passed(self) -> bool:
        return not self.differences

    def refuse(self) -> None:
        """Raise the one DeploymentError of a directory that does not compute what the checkpoint computes."""
        if self.passed:
            return
        raise DeploymentError(
            f"{self.hf_dir} does not compute what {self.checkpoint} computes: " + "; ".join(self.differences) + ".",
            hint="Export the checkpoint again (evaluate export-hf CKPT OUT --force); scores from this directory "
            "would not be the checkpoint's.",
        )

    def provenance(self) -> dict[str, Any]:
        """What results.json keeps of it."""
        values = asdict(self)
        values["prompts"] = [{**asdict(p), "greedy_identical": p.greedy_identical} for p in self.prompts]
        values.update(
            passed=self.passed, max_abs_logit_diff=self.max_abs_logit_diff, greedy_identical=self.greedy_identical
        )
        return values


def check_parity(checkpoint: str | Path, hf_dir: str | Path, *, tokenizer: str | None = None) -> ParityReport:
    """Compare the Hugging Face directory `hf_dir` with the Megatron `checkpoint` (see the module docstring).

    Returns the report, whether or not it passed (`report.refuse()` raises on a difference). Slow: loads
    both models on the CPU in float32 (seconds for the test models, ~a minute for SmolLM2-135M).
    """
    from ckpteval.server.checkpoint import load_checkpoint_info

    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise DeploymentError(f"{hf_dir} is not a Hugging Face model directory (no config.json).")
    info = load_checkpoint_info(checkpoint, tokenizer=tokenizer)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    compared, config_differences = _compare_config(info.architecture, config)
    stored = _read_safetensors(hf_dir)
    dtype = _dtype_of(stored)

    loaded = _load_megatron(checkpoint, tokenizer, dtype)
    tensor_differences, n_tensors = _compare_tensors(loaded.runner.model, info, config, stored)
    del stored
    hf_model, hf_tokenizer = _load_hf(hf_dir)
    prompts = _prompts(loaded.runner.tokenizer, info.architecture.max_position_embeddings)
    tokenizer_differences = _compare_tokenizers(loaded.runner.tokenizer, hf_tokenizer)
    results = tuple(_compare_forward(name, ids, loaded.runner, hf_model, config) for name, ids in prompts)
    return ParityReport(
        checkpoint=str(info.iter_dir),
        hf_dir=str(hf_dir),
        dtype=dtype,
        tolerance=TOLERANCE,
        config_compared=tuple(compared),
        config_differences=tuple(config_differences),
        tensors_compared=n_tensors,
        tensor_differences=tuple(tensor_differences),
        tokenizer_differences=tuple(tokenizer_differences),
        prompts=results,
    )


def _compare_config(arch: Any, config: dict[str, Any]) -> tuple[list[str], list[str]]:
    from ckpteval.checkpoint.hf_export_config import legacy_view, nope_layers
    from ckpteval.checkpoint.origin import compare_with_origin

    view = legacy_view(config)
    fields = asdict(arch)
    if arch.is_moe and arch.moe_layer_freq == 1 and view.get("model_type") == "mixtral":
        # every MLP is experts: Mixtral's intermediate_size is theirs, and the dense size computes nothing
        fields["ffn_hidden_size"] = arch.moe_ffn_hidden_size
    # what config.json does not say is listed by the origin check as not compared: the export writes every
    # setting the args hold, so those are the ones transformers has no key for (they compute nothing here)
    compared, disagreements, _not_compared = compare_with_origin(fields, view)
    differences = [str(d).replace(" in it", " in config.json") for d in disagreements]
    window = None if arch.window_size is None else arch.window_size[0] + 1
    theirs = view.get("sliding_window") if view.get("use_sliding_window", True) else None
    compared += [] if "window_size" in compared else ["window_size"]
    if (theirs or None) != window:
        differences.append(f"window_size={arch.window_size} in the checkpoint, sliding_window={theirs} in config.json")
    compared += ["rotary_interleaved", "no_rope_freq"]
    llama4 = view.get("model_type") == "llama4_text"  # the one family that rotates interleaved pairs
    if arch.rotary_interleaved != llama4:
        differences.append(f"rotary_interleaved={arch.rotary_interleaved} in the checkpoint, model_type="
                           f"{view.get('model_type')} in config.json")  # fmt: skip
    mine = [0 if nope else 1 for nope in nope_layers(arch)]
    rotating = view.get("no_rope_layers") if llama4 else [1] * arch.num_layers
    if rotating != mine:
        differences.append(f"no_rope_freq={arch.no_rope_freq} in the checkpoint, no_rope_layers={rotating} in "
                           "config.json")  # fmt: skip
    return compared, differences


def _read_safetensors(hf_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise DeploymentError(f"{hf_dir} has no *.safetensors weights.")
    tensors: dict[str, Any] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def _dtype_of(tensors: dict[str, Any]) -> str:
    from collections import Counter

    counts = Counter(str(t.dtype).removeprefix("torch.") for t in tensors.values())
    return counts.most_common(1)[0][0]


def _load_megatron(checkpoint: str | Path, tokenizer: str | None, dtype: str) -> Any:
    """The builtin engine on the checkpoint in float32, its weights rounded through `dtype` (the export's)."""
    import torch

    from ckpteval.server.runtime import quiet_library_logs, torch_dtype
    from ckpteval.server.serve import load_model

    quiet_library_logs()
    loaded = load_model(Path(checkpoint), device="cpu", dtype="float32", tokenizer=tokenizer)
    narrow = torch_dtype(dtype) if dtype in ("bfloat16", "float16") else None
    if narrow is not None:
        with torch.no_grad():
            for parameter in loaded.runner.model.parameters():
                parameter.copy_(parameter.to(narrow).float())
    return loaded


def _compare_tensors(model: Any, info: Any, config: dict[str, Any], stored: dict[str, Any]) -> tuple[list[str], int]:
    from ckpteval.checkpoint.hf_export_config import hf_family
    from ckpteval.hfexport.weights import megatron_to_hf

    arch = info.architecture
    try:
        family = hf_family(arch, where=str(info.iter_dir))
        vocab = int(config.get("vocab_size") or arch.padded_vocab_size)
        expected = megatron_to_hf(model.state_dict(), arch, family, vocab_size=min(vocab, arch.padded_vocab_size))
    except DeploymentError as exc:
        return [exc.message], 0
    if config.get("tie_word_embeddings") and "lm_head.weight" in stored and "lm_head.weight" not in expected:
        expected["lm_head.weight"] = expected["model.embed_tokens.weight"]
    missing = sorted(set(expected) - set(stored))
    extra = sorted(set(stored) - set(expected))
    differ = []
    for name in sorted(set(expected) & set(stored)):
        mine, theirs = expected[name], stored[name]
        if tuple(mine.shape) != tuple(theirs.shape):
            differ.append(f"{name} shape {list(theirs.shape)}, the checkpoint's {list(mine.shape)}")
        elif not bool((mine.to(theirs.dtype) == theirs).all()):
            diff = float((mine.float() - theirs.float()).abs().max())
            differ.append(f"{name} (max |diff| {diff:.3g})")
    out = _named("missing", missing) + _named("not in the checkpoint", extra) + _named("differ", differ)
    return out, len(expected)


def _named(what: str, names: list[str]) -> list[str]:
    if not names:
        return []
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return [f"{what}: {', '.join(names[:4])}{more}"]


def _load_hf(hf_dir: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, attn_implementation="eager")
        tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    except (OSError, ValueError, KeyError) as exc:
        raise DeploymentError(f"transformers cannot load {hf_dir}: {exc}") from None
    return model.eval(), tokenizer


def _prompts(tokenizer: Any, max_positions: int) -> list[tuple[str, list[int]]]:
    """(name, ids) of the fixed prompts, tokenized as the builtin server tokenizes them."""
    chat = tokenizer.encode(tokenizer.render_chat(CHAT), add_special_tokens=False)
    plain = tokenizer.encode(PLAIN)
    budget = min(LONG_PROMPT_TOKENS, max_positions - NEW_TOKENS)
    long_ids: list[int] = []
    text = _LONG_TEXT
    while len(long_ids) < budget:
        long_ids = tokenizer.encode(text)
        text += _LONG_TEXT
    return [("chat", chat[:budget]), ("plain", plain[:budget]), ("long", long_ids[:budget])]


def _compare_tokenizers(served: Any, theirs: Any) -> list[str]:
    out = []
    rendered = served.render_chat(CHAT)
    their_render = theirs.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    if rendered != their_render:
        out.append("the chat template renders another prompt")
    for name, text in (("chat", rendered), ("plain", PLAIN), ("long", _LONG_TEXT)):
        special = name != "chat"
        if served.encode(text, add_special_tokens=special) != list(theirs.encode(text, add_special_tokens=special)):
            out.append(f"the {name} prompt's ids differ")
    if served.eos_token_id != theirs.eos_token_id:
        out.append(f"eos id {theirs.eos_token_id}, the server's {served.eos_token_id}")
    return out


def _compare_forward(name: str, ids: list[int], runner: Any, hf_model: Any, config: dict[str, Any]) -> PromptResult:
    import torch

    from ckpteval.server.engine import SamplingParams

    vocab = int(config.get("vocab_size") or 0)
    length = len(ids)
    tokens = torch.tensor([ids])
    mask = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)[None, None]
    with torch.inference_mode():
        ours = runner.model(input_ids=tokens, position_ids=torch.arange(length)[None], attention_mask=mask)
        theirs = hf_model(tokens).logits
    vocab = min(vocab or theirs.shape[-1], ours.shape[-1], theirs.shape[-1])
    diff = float((ours[..., :vocab].float() - theirs[..., :vocab].float()).abs().max())
    megatron_tokens = runner.generate([(ids, SamplingParams(max_tokens=NEW_TOKENS))])[0].token_ids
    eos = runner.tokenizer.eos_token_id
    with torch.inference_mode():
        generated = hf_model.generate(
            tokens,
            attention_mask=torch.ones_like(tokens),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos if eos is not None else 0,
        )
    hf_tokens = generated[0, length:].tolist()
    if eos is not None and eos in hf_tokens:
        hf_tokens = hf_tokens[: hf_tokens.index(eos)]
    return PromptResult(
        name=name,
        tokens=length,
        max_abs_logit_diff=diff,
        greedy_megatron=tuple(megatron_tokens),
        greedy_hf=tuple(hf_tokens),
    )
