"""`evaluate export-hf CKPT OUT`: a Megatron checkpoint as a Hugging Face directory, checked against it.

Not `evaluate export`, which sends an invocation's results to W&B or MLflow: this one writes a model.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from pathlib import Path
from typing import Annotated

import typer


def export_hf_command(
    checkpoint: Annotated[str, typer.Argument(metavar="CKPT", help="A Megatron checkpoint: root or iter_* dir.")],
    output: Annotated[Path, typer.Argument(metavar="OUT", help="The Hugging Face directory to write.")],
    dtype: Annotated[
        str,
        typer.Option("--dtype", help="checkpoint (the stored weights' dtype), float32, bfloat16 or float16."),
    ] = "checkpoint",
    tokenizer: Annotated[
        str | None, typer.Option("--tokenizer", help="The tokenizer to serve with (an HF dir or hub id).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Write it again even if OUT holds it.")] = False,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Prove OUT computes what CKPT computes (default).")
    ] = True,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Write a Megatron checkpoint as a Hugging Face directory (for vLLM, SGLang, transformers).

    config.json from the checkpoint's args, safetensors in its dtype (or --dtype), the vocabulary
    unpadded, its tokenizer and chat template, generation_config.json. Then the parity check:
    transformers on OUT against the builtin engine on CKPT (config, every tensor, tokenizer ids,
    logits, greedy tokens); a difference is refused, naming it.

      evaluate export-hf ckpts/smollm2 hf/smollm2
      vllm serve hf/smollm2
    """
    import json

    import ckpteval

    result = ckpteval.export_hf(checkpoint, output, dtype=dtype, tokenizer=tokenizer, force=force, check=check)
    if json_output:
        typer.echo(json.dumps(result.provenance(), indent=2, default=str))
        return
    export = result.export
    written = "found (the same checkpoint content)" if export.reused else "written"
    typer.echo(f"{export.output}: {written}")
    typer.echo(f"  {export.architecture}, {export.tensors} tensors, {export.dtype}, {export.bytes / 1e6:,.1f} MB")
    typer.echo(f"  vocabulary: {export.vocab_size} of the checkpoint's {export.padded_vocab_size} rows")
    parity = result.parity
    if parity is None:
        typer.echo("  parity: not checked (--no-check)")
        return
    again = " (kept from its first check)" if result.parity_reused else ""
    typer.echo(
        f"  parity{again}: passed: {len(parity['config_compared'])} config fields, "
        f"{parity['tensors_compared']} tensors,"
    )
    typer.echo(f"    tokenizer ids, logits max |diff| {parity['max_abs_logit_diff']:.2g} <= {parity['tolerance']:g},")
    typer.echo(f"    greedy tokens identical on {len(parity['prompts'])} prompts")
