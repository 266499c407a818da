"""`evaluate deploy`: serve a Megatron checkpoint behind an OpenAI-compatible API on this machine."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from pathlib import Path
from typing import Annotated

import typer


def deploy_command(
    checkpoint: Annotated[
        Path,
        typer.Option(
            "--checkpoint", help="The checkpoint root (with latest_checkpointed_iteration.txt) or an iter_* directory."
        ),
    ],
    port: Annotated[int, typer.Option("--port", help="TCP port to listen on.")] = 8000,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (0.0.0.0 for every interface).")
    ] = "127.0.0.1",
    served_model_name: Annotated[
        str, typer.Option("--served-model-name", help="The model name clients must send (or omit).")
    ] = "megatron-model",
    device: Annotated[
        str, typer.Option("--device", help="auto (a GPU when there is one), cpu, cuda or cuda:N.")
    ] = "auto",
    dtype: Annotated[
        str,
        typer.Option("--dtype", help="auto (float32 on CPU, the training dtype on GPU), float32, bfloat16, float16."),
    ] = "auto",
    max_batch_size: Annotated[
        int | None, typer.Option("--max-batch-size", help="Most requests run in one forward pass. [default: 16]")
    ] = None,
    max_batch_tokens: Annotated[
        int | None,
        typer.Option("--max-batch-tokens", help="Most padded tokens in one scoring forward. [default: 32768]"),
    ] = None,
    replicas: Annotated[
        int, typer.Option("--replicas", help="Server processes behind this port; each request goes to the least busy.")
    ] = 1,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer",
            help="A Hugging Face tokenizer directory or hub id. Default: the checkpoint's own (evaluate inspect).",
        ),
    ] = None,
    # one flag, not an on/off pair: the pair's second name takes a help column of its own at 80 columns
    no_prefix_cache: Annotated[
        bool,
        typer.Option("--no-prefix-cache", help="Compute every token (by default a shared prefix is computed once)."),
    ] = False,
    prefix_cache_mib: Annotated[
        int, typer.Option("--prefix-cache-mib", help="Memory the prefix cache may hold, in MiB.")
    ] = 1024,
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every request.")] = False,
) -> None:
    """Serve a Megatron checkpoint with megatron-core: /v1/completions, /v1/chat/completions, /v1/models, /v1/health.

    Runs on one GPU, or on the CPU when there is none. Ctrl-C stops it.

      evaluate prepare smollm2 --output ckpts/smollm2
      evaluate deploy --checkpoint ckpts/smollm2 --port 8000
      curl localhost:8000/v1/completions -d '{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}'
    """
    import ckpteval
    from ckpteval.types import ServeOptions

    ckpteval.serve(
        ServeOptions(
            checkpoint=checkpoint,
            port=port,
            host=host,
            served_model_name=served_model_name,
            device=device,
            dtype=dtype,
            max_batch_size=max_batch_size,
            max_batch_tokens=max_batch_tokens,
            replicas=replicas,
            tokenizer=None if tokenizer is None else str(tokenizer),
            access_log=access_log,
            prefix_cache=not no_prefix_cache,
            prefix_cache_mib=prefix_cache_mib,
        )
    )
