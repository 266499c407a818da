"""Serve a Megatron checkpoint: bind the port, load the model, run uvicorn until Ctrl-C or SIGTERM.

The port is bound before the model loads (seconds to minutes), so "port in use" fails at once
and the port cannot be taken meanwhile; connections are refused until the model is ready, which
is what a health check waits for.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import errno
import logging
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.errors import DeploymentError

DEFAULT_MODEL_NAME = "megatron-model"
DEFAULT_MAX_BATCH_SIZE = 16
DEFAULT_PREFIX_CACHE_MIB = 1024  # half the working memory the scheduler lets one forward take

log = logging.getLogger("ckpteval.deploy")


@dataclass(frozen=True)
class ServeOptions:
    """Everything `serve` needs."""

    checkpoint: Path
    port: int = 8000
    host: str = "127.0.0.1"
    served_model_name: str = DEFAULT_MODEL_NAME
    device: str = "auto"
    dtype: str = "auto"
    max_batch_size: int | None = None
    max_batch_tokens: int | None = None
    tokenizer: str | None = None  # a Hugging Face tokenizer dir or hub id; None: the checkpoint's
    access_log: bool = False
    replicas: int = 1  # > 1: that many server processes behind one router (see `deploy.router`)
    prefix_cache: bool = True  # score each shared token prefix once (see `deploy.prefix_cache`)
    prefix_cache_mib: int = DEFAULT_PREFIX_CACHE_MIB


@dataclass
class LoadedModel:
    """A checkpoint loaded for serving."""

    runner: Any  # engine.ModelRunner
    info: Any  # checkpoint.CheckpointInfo
    device: str
    dtype: str


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound (not yet listening) to host:port; DeploymentError if it is taken."""
    if not 0 < port < 65536:
        raise DeploymentError(f"Port {port} is out of range (1-65535).")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise DeploymentError(f"Cannot resolve host {host!r}: {exc.strerror}.") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # rebinding after a restart; not sharing
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise DeploymentError(
                f"Port {port} on {host} is already in use.",
                hint="Pick another --port, or stop the process that listens on it.",
            ) from None
        raise DeploymentError(f"Cannot bind {host}:{port}: {exc.strerror}.") from None
    return sock


def load_model(
    checkpoint: Path, *, device: str = "auto", dtype: str = "auto", tokenizer: str | None = None
) -> LoadedModel:
    """Read the checkpoint, set up the runtime and return a ready `ModelRunner` (slow: imports megatron)."""
    from ckpteval.deploy.checkpoint import load_checkpoint_info
    from ckpteval.deploy.engine import ModelRunner
    from ckpteval.deploy.model import build_gpt_model, load_weights
    from ckpteval.deploy.runtime import init_runtime
    from ckpteval.deploy.tokenizer import ServedTokenizer

    info = load_checkpoint_info(checkpoint, tokenizer=tokenizer)
    runtime = init_runtime(device, dtype, trained_in=info.architecture.params_dtype)
    served_tokenizer = ServedTokenizer(info.tokenizer_dir)
    model = build_gpt_model(info.architecture, dtype=runtime.dtype)
    load_weights(model, info.iter_dir)
    model = model.to(runtime.device).requires_grad_(False)
    runner = ModelRunner(
        model, served_tokenizer, device=runtime.device, max_context=info.architecture.max_position_embeddings
    )
    return LoadedModel(runner=runner, info=info, device=runtime.device, dtype=runtime.dtype)


def build_app(
    loaded: LoadedModel,
    *,
    served_model_name: str = DEFAULT_MODEL_NAME,
    max_batch_size: int | None = None,
    max_batch_tokens: int | None = None,
    prefix_cache_mib: int | None = DEFAULT_PREFIX_CACHE_MIB,
) -> tuple[Any, Any]:
    """(ASGI app, started Scheduler) for a loaded model; `prefix_cache_mib` None: no prefix cache. Stop the
    scheduler when done."""
    from ckpteval.deploy.app import AsgiApp, OpenAIServer
    from ckpteval.deploy.scheduler import Scheduler

    if max_batch_size is not None and max_batch_size < 1:
        raise DeploymentError(f"--max-batch-size must be at least 1, not {max_batch_size}.")
    if max_batch_tokens is not None and max_batch_tokens < 1:
        raise DeploymentError(f"--max-batch-tokens must be at least 1, not {max_batch_tokens}.")
    if prefix_cache_mib is not None:
        if prefix_cache_mib < 1:
            raise DeploymentError(
                f"--prefix-cache-mib must be at least 1, not {prefix_cache_mib}.",
                hint="--no-prefix-cache switches the cache off.",
            )
        loaded.runner.enable_prefix_cache(prefix_cache_mib * 1024**2)
    scheduler = Scheduler(loaded.runner, max_batch_size=max_batch_size or DEFAULT_MAX_BATCH_SIZE)
    if max_batch_tokens is not None:
        scheduler.max_batch_tokens = max_batch_tokens
    handlers = OpenAIServer(
        scheduler,
        loaded.runner.tokenizer,
        served_model_name=served_model_name,
        max_context=loaded.runner.max_context,
        vocab_size=loaded.runner.vocab_limit,
    )
    scheduler.start()
    return AsgiApp(handlers), scheduler


class _Terminated(Exception):
    """SIGTERM, turned into an exception so shutdown runs like after Ctrl-C."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated


def serve(options: ServeOptions) -> None:
    """Serve `options.checkpoint` until interrupted (Ctrl-C or SIGTERM end it cleanly)."""
    if options.replicas < 1:
        raise DeploymentError(f"--replicas must be at least 1, not {options.replicas}.")
    if options.prefix_cache and options.prefix_cache_mib < 1:
        raise DeploymentError(
            f"--prefix-cache-mib must be at least 1, not {options.prefix_cache_mib}.",
            hint="--no-prefix-cache switches the cache off.",
        )
    if options.replicas > 1:
        from ckpteval.deploy.router import serve_replicas

        sock = bind_socket(options.host, options.port)
        try:
            serve_replicas(options, sock, _say)
        finally:
            sock.close()
        return
    import uvicorn

    from ckpteval.deploy.runtime import quiet_library_logs

    quiet_library_logs()
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    sock = bind_socket(options.host, options.port)
    scheduler = None
    try:
        started = time.perf_counter()
        _say(f"Loading {options.checkpoint} ...")
        loaded = load_model(options.checkpoint, device=options.device, dtype=options.dtype, tokenizer=options.tokenizer)
        app, scheduler = build_app(
            loaded,
            served_model_name=options.served_model_name,
            max_batch_size=options.max_batch_size,
            max_batch_tokens=options.max_batch_tokens,
            prefix_cache_mib=options.prefix_cache_mib if options.prefix_cache else None,
        )
        arch = loaded.info.architecture
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_level="warning",
            access_log=options.access_log,
            timeout_graceful_shutdown=10,
            backlog=1024,
        )
        server = uvicorn.Server(config)
        url = f"http://{options.host}:{options.port}"
        _say(
            f"Serving '{options.served_model_name}' ({_millions(loaded.runner.model)} parameters, "
            f"{arch.num_layers} layers, context {arch.max_position_embeddings}) on {url} "
            f"[{loaded.device}, {loaded.dtype}, "
            + (f"prefix cache {options.prefix_cache_mib} MiB], " if options.prefix_cache else "no prefix cache], ")
            + f"ready in {time.perf_counter() - started:.1f} s. Ctrl-C stops it."
        )
        previous = signal.signal(signal.SIGTERM, _raise_terminated) if _in_main_thread() else None
        try:
            server.run(sockets=[sock])
        except (KeyboardInterrupt, _Terminated):
            pass
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        _say("Server stopped.")
    finally:
        if scheduler is not None:
            scheduler.stop()
            _say(prompt_summary(scheduler.stats))
        sock.close()


def prompt_summary(stats: Any) -> str:
    """The exit line: prompt tokens, how many the model computed and how many the prefix cache served."""
    share = stats.cached_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
    return (
        f"Prompt tokens: {stats.prompt_tokens}, computed {stats.computed_tokens}, "
        f"from the prefix cache {stats.cached_tokens} ({share:.0%})."
    )


def _millions(model: Any) -> str:
    count = sum(p.numel() for p in model.parameters())
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _say(message: str) -> None:
    """A line of the server's own story (loading, serving, stopped) on its stderr: the deployment log."""
    announce = logging.getLogger("ckpteval.deploy.serve")
    if not announce.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        announce.addHandler(handler)
        announce.setLevel(logging.INFO)
        announce.propagate = False
    announce.info(message)
