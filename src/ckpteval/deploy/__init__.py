"""The builtin deployment: serve a Megatron checkpoint behind an OpenAI-compatible API.

Light to import (stdlib only); torch and megatron load when a model does. Public API:

- `prepare_checkpoint(name, output, force=False)`, `ensure_prepared(name, path)`,
  `default_checkpoint_dir(name)`: the packaged models ("smollm2", "tiny") as Megatron checkpoints.
- `load_checkpoint_info(path)`: a checkpoint's architecture and tokenizer (imports torch).
- `serve(ServeOptions(...))`: run the server in this process.
- `serve_command(...)`, `wait_until_healthy(...)`: start it as a job's deployment and wait for it;
  `start_local_server(...)` does both on this machine and returns a handle that stops it.
"""

from __future__ import annotations

from ckpteval.deploy.checkpoint import CheckpointInfo, load_checkpoint_info
from ckpteval.deploy.launch import LocalServer, health_url, serve_command, start_local_server, wait_until_healthy
from ckpteval.deploy.layout import CheckpointLayout, locate_checkpoint
from ckpteval.deploy.prepare import PACKAGED_MODELS, default_checkpoint_dir, ensure_prepared, prepare_checkpoint
from ckpteval.deploy.server import ServeOptions, serve

__all__ = [
    "PACKAGED_MODELS",
    "CheckpointInfo",
    "CheckpointLayout",
    "LocalServer",
    "ServeOptions",
    "default_checkpoint_dir",
    "ensure_prepared",
    "health_url",
    "load_checkpoint_info",
    "locate_checkpoint",
    "prepare_checkpoint",
    "serve",
    "serve_command",
    "start_local_server",
    "wait_until_healthy",
]
