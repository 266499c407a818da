"""Serve a Megatron checkpoint: hold the port, load the model, run uvicorn until Ctrl-C or SIGTERM.

The port is bound AND listened on before anything slow (preparing a packaged model, publishing the
tokenizer, loading the weights), so a port another process holds fails at once and no other server can
take it meanwhile: two servers never share a port (`SO_REUSEADDR` only lets a restart rebind over
connections in TIME_WAIT; a second listener on the port is refused). Until the model is ready a small
responder answers every request with 503 "loading", naming the deployment's identity, which is what a
health check waits for.

Identity: a job gives its deployment a token (`--identity`); `/v1/health` and `/v1/models` report it, so
the job's health wait and every task client check that the port answers for *their* deployment, not for
another job's server that happens to listen there. With `--port-file` the server writes the port it holds
there (atomically) as soon as it holds it; with `--port-fallback` a taken preferred port is replaced by one
the kernel assigns, so a job never waits on, or shares, a port another job took first.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import errno
import json
import logging
import re
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.errors import DeploymentError
from ckpteval.server.announce import publish_port, say
from ckpteval.server.identity import identity_payload
from ckpteval.server.options import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MODEL_NAME, ServeOptions

log = logging.getLogger("ckpteval.deploy")


@dataclass
class LoadedModel:
    """A checkpoint loaded for serving."""

    runner: Any  # engine.ModelRunner
    info: Any  # checkpoint.CheckpointInfo
    device: str
    dtype: str
    report: Any = None  # server.loaded.LoadedReport: what was read, its content identity


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port and listening (port 0: one the kernel assigns); DeploymentError if
    another socket holds the port. Listening at once is what makes the port ours: two sockets with
    SO_REUSEADDR may both *bind* a port nobody listens on yet, but only one can listen."""
    if not 0 <= port < 65536:
        raise DeploymentError(f"Port {port} is out of range (1-65535).")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise DeploymentError(f"Cannot resolve host {host!r}: {exc.strerror}.") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # rebinding over TIME_WAIT; listen() refuses sharing
    try:
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise DeploymentError(
                f"Port {port} on {host} is already in use.",
                hint="Pick another --port, or stop the process that listens on it.",
            ) from None
        raise DeploymentError(f"Cannot bind {host}:{port}: {exc.strerror}.") from None
    return sock


def hold_port(options: ServeOptions) -> socket.socket:
    """The listening socket `options` asks for: its port, or with `port_fallback` one the kernel assigns
    when that one is taken; the port held is written to `options.port_file` (if any) before returning."""
    try:
        sock = bind_socket(options.host, options.port)
    except DeploymentError:
        if not options.port_fallback or options.port == 0:
            raise
        sock = bind_socket(options.host, 0)
        say(f"Port {options.port} is taken; serving on port {bound_port(sock)} instead.")
    if options.port_file is not None:
        publish_port(options.port_file, bound_port(sock))
    return sock


def bound_port(sock: socket.socket) -> int:
    """The port a bound socket holds."""
    return int(sock.getsockname()[1])


class LoadingResponder:
    """Answers every request on a listening socket with 503 "loading" (and the deployment's identity) until
    `stop()`, so that a health check sees this deployment loading rather than a connection left hanging in
    the backlog. Runs in a thread; `stop()` returns once no connection is being answered, and the socket
    then goes to the real server untouched."""

    def __init__(self, sock: socket.socket, identity: str | None) -> None:
        self._sock = sock
        body = json.dumps({"status": "loading", **identity_payload(identity)}).encode()
        self._response = (
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckpteval-loading", daemon=True)

    def start(self) -> LoadingResponder:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering (idempotent): the socket goes to the real server untouched."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> Any:
        """Start it; the block gets `stop`, to hand the socket over once the model serves (and the end of
        the block stops it whatever happened)."""
        return self.start().stop

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stopping.is_set():
            ready, _, _ = select.select([self._sock], [], [], 0.1)
            if not ready or self._stopping.is_set():
                continue
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, OSError):
                continue
            with conn:
                try:
                    conn.settimeout(1.0)
                    conn.recv(65536)  # the request head; its content does not matter
                    conn.sendall(self._response)
                except OSError:
                    pass


def load_model(
    checkpoint: Path,
    *,
    device: str = "auto",
    dtype: str = "auto",
    tokenizer: str | None = None,
    ignore_unexpected_tensors: bool = False,
    pinned: str | None = None,
) -> LoadedModel:
    """Read the checkpoint (`pinned`: that iteration of it), set up the runtime and return a ready
    `ModelRunner` (slow: imports megatron). A checkpoint holding tensors the model its args build lacks is
    refused unless `ignore_unexpected_tensors`."""
    from ckpteval.server.checkpoint import load_checkpoint_info
    from ckpteval.server.engine import ModelRunner
    from ckpteval.server.loaded import loaded_report
    from ckpteval.server.model import build_gpt_model, check_no_unexpected_tensors, load_weights
    from ckpteval.server.runtime import init_runtime
    from ckpteval.server.tokenizer import ServedTokenizer

    info = load_checkpoint_info(checkpoint, tokenizer=tokenizer, pinned=pinned)
    runtime = init_runtime(device, dtype, trained_in=info.architecture.params_dtype)
    served_tokenizer = ServedTokenizer(info.tokenizer_dir)
    model = build_gpt_model(info.architecture, dtype=runtime.dtype)
    check_no_unexpected_tensors(model, info.architecture, info.iter_dir, ignore=ignore_unexpected_tensors)
    load_weights(model, info.iter_dir)
    model = model.to(runtime.device).requires_grad_(False)
    runner = ModelRunner(
        model, served_tokenizer, device=runtime.device, max_context=info.architecture.max_position_embeddings
    )
    # after the load: the files it read are in the page cache, and what is hashed is what was loaded
    report = loaded_report(info, pinned=pinned, device=runtime.device, dtype=runtime.dtype)
    return LoadedModel(runner=runner, info=info, device=runtime.device, dtype=runtime.dtype, report=report)


def build_app(
    loaded: LoadedModel,
    *,
    served_model_name: str = DEFAULT_MODEL_NAME,
    max_batch_size: int | None = None,
    max_batch_tokens: int | None = None,
    prefix_cache: bool = True,
    prefix_cache_mib: int | None = None,
    identity: str | None = None,
) -> tuple[Any, Any]:
    """(ASGI app, started Scheduler) for a loaded model; `prefix_cache_mib` None: the prefix cache sized to the
    machine (`prefix_cache.default_budget_mib`). Stop the scheduler when done."""
    from ckpteval.server.app import AsgiApp, OpenAIServer
    from ckpteval.server.scheduler import Scheduler

    if max_batch_size is not None and max_batch_size < 1:
        raise DeploymentError(f"--max-batch-size must be at least 1, not {max_batch_size}.")
    if max_batch_tokens is not None and max_batch_tokens < 1:
        raise DeploymentError(f"--max-batch-tokens must be at least 1, not {max_batch_tokens}.")
    if prefix_cache:
        from ckpteval.server.prefix_cache import default_budget_mib

        if prefix_cache_mib is not None and prefix_cache_mib < 1:
            raise DeploymentError(
                f"--prefix-cache-mib must be at least 1, not {prefix_cache_mib}.",
                hint="--no-prefix-cache switches the cache off.",
            )
        loaded.runner.enable_prefix_cache((prefix_cache_mib or default_budget_mib()) * 1024**2)
    scheduler = Scheduler(loaded.runner, max_batch_size=max_batch_size or DEFAULT_MAX_BATCH_SIZE)
    if max_batch_tokens is not None:
        scheduler.max_batch_tokens = max_batch_tokens
    handlers = OpenAIServer(
        scheduler,
        loaded.runner.tokenizer,
        served_model_name=served_model_name,
        max_context=loaded.runner.max_context,
        vocab_size=loaded.runner.vocab_limit,
        identity=identity,
        checkpoint=loaded.report.to_json() if loaded.report is not None else None,
    )
    scheduler.start()
    return AsgiApp(handlers), scheduler


class _Terminated(Exception):
    """SIGTERM, turned into an exception so shutdown runs like after Ctrl-C."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated


def serve(options: ServeOptions, sock: socket.socket | None = None) -> None:
    """Serve `options.checkpoint` until interrupted (Ctrl-C or SIGTERM end it cleanly). `sock`: the
    listening socket already held (`hold_port`), else the port is taken now."""
    if options.replicas < 1:
        raise DeploymentError(f"--replicas must be at least 1, not {options.replicas}.")
    if options.replicas > 1 and options.load_secret_file is not None:
        raise DeploymentError(
            "--load-secret-file loads in place into one server process, not into --replicas "
            f"{options.replicas} behind a router.",
            hint="Serve one replica, or start a fresh deployment per checkpoint.",
        )
    if options.prefix_cache and options.prefix_cache_mib is not None and options.prefix_cache_mib < 1:
        raise DeploymentError(
            f"--prefix-cache-mib must be at least 1, not {options.prefix_cache_mib}.",
            hint="--no-prefix-cache switches the cache off.",
        )
    sock = sock if sock is not None else hold_port(options)
    try:
        if options.replicas > 1:
            from ckpteval.server.router import serve_replicas

            with LoadingResponder(sock, options.identity) as loaded_now:
                serve_replicas(options, sock, say, ready=loaded_now)
            return
        _serve_one(options, sock)
    finally:
        sock.close()


def _serve_one(options: ServeOptions, sock: socket.socket) -> None:
    import uvicorn

    from ckpteval.server.runtime import quiet_library_logs

    quiet_library_logs()
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    scheduler = None
    try:
        with LoadingResponder(sock, options.identity) as ready:
            started = time.perf_counter()
            say(f"Loading {options.checkpoint} ...")
            loaded = load_model(
                options.checkpoint,
                device=options.device,
                dtype=options.dtype,
                tokenizer=options.tokenizer,
                ignore_unexpected_tensors=options.ignore_unexpected_tensors,
                pinned=options.iteration,
            )
            app, scheduler = build_app(
                loaded,
                served_model_name=options.served_model_name,
                max_batch_size=options.max_batch_size,
                max_batch_tokens=options.max_batch_tokens,
                prefix_cache=options.prefix_cache,
                prefix_cache_mib=options.prefix_cache_mib,
                identity=options.identity,
            )
            arch = loaded.info.architecture
            if options.load_secret_file is not None:
                _accept_loads(options, loaded, app)
            if options.report_file is not None and loaded.report is not None:
                from ckpteval.server.loaded import write_report

                write_report(options.report_file, loaded.report.to_json())
            config = uvicorn.Config(
                app,
                lifespan="off",
                log_level="warning",
                access_log=options.access_log,
                # plain lines in the log file: uvicorn colours them whenever its stdout looks like a terminal
                # (a Slurm step's did), and `"POST /v1/...` then read `"\x1b[1mPOST /v1/...` to every reader
                use_colors=False,
                timeout_graceful_shutdown=10,
                backlog=1024,
            )
            if options.access_log:  # uvicorn logs requests at INFO: under log_level warning they were dropped
                logging.getLogger("uvicorn.access").setLevel(logging.INFO)
            server = uvicorn.Server(config)
            url = f"http://{options.host}:{bound_port(sock)}"
            ready()
        say(
            f"Loaded {loaded.report.path} (iteration {loaded.report.iteration}, content "
            f"{loaded.report.content.sha256[:12]}: {loaded.report.content.method}, "
            f"{loaded.report.content.seconds:.1f} s).\n"
            f"Serving '{options.served_model_name}' ({_millions(loaded.runner.model)} parameters, "
            f"{arch.num_layers} layers, context {arch.max_position_embeddings}) on {url} "
            f"[{loaded.device}, {loaded.dtype}, "
            + (f"prefix cache {_cache_mib(loaded.runner)} MiB], " if options.prefix_cache else "no prefix cache], ")
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
        say("Server stopped.")
    finally:
        if scheduler is not None:
            scheduler.stop()
            say(prompt_summary(scheduler.stats))


def _accept_loads(options: ServeOptions, loaded: LoadedModel, app: Any) -> None:
    """Serve `POST /v1/load` (`server.inplace`) to whoever reads the secret written to `--load-secret-file`."""
    from ckpteval.server.inplace import LOAD_ROUTE, InPlaceLoader, write_load_secret

    assert options.load_secret_file is not None
    scorer = loaded.runner.prefix_scorer
    loader = InPlaceLoader(
        secret=write_load_secret(options.load_secret_file),
        loaded=loaded,
        app=app,
        tokenizer=options.tokenizer,
        ignore_unexpected_tensors=options.ignore_unexpected_tensors,
        prefix_cache_bytes=scorer.cache.budget_bytes if scorer is not None else None,
        report_file=options.report_file,
    )
    app.admin[LOAD_ROUTE] = loader.handle


def prompt_summary(stats: Any) -> str:
    """The exit line: prompt tokens, how many the model computed and how many the prefix cache served."""
    share = stats.cached_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
    return (
        f"Prompt tokens: {stats.prompt_tokens}, computed {stats.computed_tokens}, "
        f"from the prefix cache {stats.cached_tokens} ({share:.0%})."
    )


_SUMMARY = re.compile(r"Prompt tokens: (\d+), computed (\d+), from the prefix cache (\d+)")


def read_prompt_summary(log: str) -> dict[str, float] | None:
    """The last exit line (`prompt_summary`) of a deployment log, as numbers: prompt, computed and cached
    tokens and the cache's hit rate (cached / prompt); None when the log has none (the server was killed)."""
    found = _SUMMARY.findall(log)
    if not found:
        return None
    prompt, computed, cached = (int(x) for x in found[-1])
    rate = round(cached / prompt, 4) if prompt else 0.0
    return {"prompt_tokens": prompt, "computed_tokens": computed, "cached_tokens": cached, "hit_rate": rate}


def _cache_mib(runner: Any) -> int:
    return runner.prefix_scorer.cache.budget_bytes // 1024**2


def _millions(model: Any) -> str:
    count = sum(p.numel() for p in model.parameters())
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
