"""Replicas: N server processes behind one port, each request sent to the least busy one.

`serve --replicas N` lands here. The parent binds the public port, starts N ordinary servers
(`serve --replicas 1`) on free local ports, waits until every one is healthy, and then forwards
HTTP/1.1 requests to whichever replica has the fewest requests in flight (ties go round-robin),
over kept-alive connections. Each replica has its own prefix cache: a completions request goes to
the replica that served the last request with the same prompt start (`PREFIX_KEY_CHARS`), unless
that one has more than `AFFINITY_SLACK` requests in flight beyond the least busy. It answers the
health route itself: healthy while at least one replica serves, with every replica's state in the
body. A replica that dies is logged and reported there; the others keep serving, and a request that
was on the dead one is retried on another (every route is safe to repeat). Ctrl-C or SIGTERM stops
the router and the replicas.

GPUs: with several in CUDA_VISIBLE_DEVICES, replicas are spread over them round-robin; with one,
they share it (several replicas of a small, launch-bound model keep one GPU busier than one).

A hand-written router rather than Ray Serve: see docs/deploy.md (dependency, per-request cost).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import itertools
import logging
import os
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

import ckpteval.routes as routes
from ckpteval.errors import DeploymentError
from ckpteval.server.identity import identity_payload
from ckpteval.server.launch import wait_until_healthy
from ckpteval.server.options import ServeOptions
from ckpteval.server.runtime import free_port

log = logging.getLogger("ckpteval.deploy")

HEALTH_PATHS = ("/v1/health", "/health")
STATS_PATH = "/v1/stats"
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
MONITOR_SECONDS = 1.0
START_TIMEOUT = 1800.0
COMPLETIONS_PATH = "/v1/completions"
PREFIX_KEY_CHARS = 256  # the prompt start that names a prefix (tokens of a token-id prompt: a quarter)
AFFINITY_SLACK = 4  # requests in flight a prefix's replica may have beyond the least busy one
AFFINITY_ENTRIES = 4096


@dataclass
class Replica:
    """One server process and the kept-alive connections to it."""

    index: int
    port: int
    process: subprocess.Popen[bytes]
    host: str = "127.0.0.1"
    in_flight: int = 0
    requests: int = 0
    alive: bool = True
    problem: str | None = None
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {
            "replica": self.index,
            "url": f"http://{self.host}:{self.port}",
            "pid": self.process.pid,
            "healthy": self.alive,
            "in_flight": self.in_flight,
            "requests": self.requests,
            "problem": self.problem,
        }


class _ReplicaFailed(Exception):
    """The connection to a replica failed: try another."""


def _response(status: int, payload: Any, *, close: bool = False) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 411: "Length Required", 413: "Payload Too Large"}.get(status, "Error")
    body = orjson.dumps(payload)
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        + ("connection: close\r\n" if close else "")
        + "\r\n"
    )
    return head.encode() + body


def _error(status: int, message: str, kind: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def _headers(head: bytes) -> tuple[str, dict[bytes, bytes]]:
    lines = head.split(b"\r\n")
    fields: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return lines[0].decode("latin-1"), fields


class Router:
    """Forwards requests to the least busy live replica."""

    def __init__(
        self, replicas: list[Replica], *, identity: str | None = None, checkpoint: dict[str, Any] | None = None
    ) -> None:
        self.replicas = replicas
        self.identity = identity
        self.checkpoint = checkpoint  # what the replicas loaded (each reports it; they agree)
        self._turn = itertools.count()
        self._holder: OrderedDict[bytes, int] = OrderedDict()  # prompt start -> replica that last served it
        self.affinity_hits = 0

    @property
    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    def pick(self, exclude: set[int], prefix: bytes | None = None) -> Replica | None:
        """The replica that served `prefix` last unless it is much busier, else the live replica with the
        fewest requests in flight (ties: round-robin)."""
        candidates = [r for r in self.live if r.index not in exclude]
        if not candidates:
            return None
        start = next(self._turn) % len(self.replicas)
        least = min(candidates, key=lambda r: (r.in_flight, (r.index - start) % len(self.replicas)))
        if prefix is None:
            return least
        held = self._holder.get(prefix)
        holder = next((r for r in candidates if r.index == held), None)
        if holder is not None and holder.in_flight <= least.in_flight + AFFINITY_SLACK:
            self.affinity_hits += holder is not least
            chosen = holder
        else:
            chosen = least
        self._holder[prefix] = chosen.index
        self._holder.move_to_end(prefix)
        if len(self._holder) > AFFINITY_ENTRIES:
            self._holder.popitem(last=False)
        return chosen

    def mark_dead(self, replica: Replica, problem: str) -> None:
        if not replica.alive:
            return
        replica.alive = False
        replica.problem = problem
        for _, writer in replica.idle:
            writer.close()
        replica.idle.clear()
        log.error(
            "Replica %d (pid %d, port %d) failed: %s. %d of %d replicas serving.",
            replica.index,
            replica.process.pid,
            replica.port,
            problem,
            len(self.live),
            len(self.replicas),
        )

    def check_processes(self) -> None:
        for replica in self.replicas:
            code = replica.process.poll()
            if code is not None:
                self.mark_dead(replica, f"the process exited with code {code}")

    async def monitor(self) -> None:
        while True:
            self.check_processes()
            await asyncio.sleep(MONITOR_SECONDS)

    def health(self) -> tuple[int, dict[str, Any]]:
        self.check_processes()
        serving = len(self.live)
        body = {
            "status": "healthy" if serving else "unhealthy",
            **identity_payload(self.identity, self.checkpoint),
            "replicas_serving": serving,
            "replicas": [r.describe() for r in self.replicas],
        }
        return (200 if serving else 503), body

    async def stats(self) -> dict[str, Any]:
        """Every live replica's counters summed (maxima for max_*), and each replica's own."""
        total: dict[str, int] = {}
        each = []
        for replica in self.live:
            try:
                status, raw = await self._send(replica, b"GET " + STATS_PATH.encode() + b" HTTP/1.1\r\nhost: r\r\n\r\n")
            except _ReplicaFailed:
                continue
            payload = orjson.loads(raw.split(b"\r\n\r\n", 1)[1]) if status == 200 else {}
            each.append({"replica": replica.index, **payload})
            for key, value in payload.items():
                total[key] = max(total.get(key, 0), value) if key.startswith("max_") else total.get(key, 0) + value
        return {**total, "router_affinity_hits": self.affinity_hits, "replicas": each}

    async def _send(self, replica: Replica, request: bytes) -> tuple[int, bytes]:
        """(status, raw response) of one request to `replica`, on a kept-alive connection if one is idle.

        The server closes idle connections after a few seconds; a kept-alive connection that fails
        is retried on a fresh one, and only a fresh connection's failure is the replica's.
        """
        while replica.idle:
            reader, writer = replica.idle.pop()
            try:
                return await self._exchange(replica, reader, writer, request)
            except _ReplicaFailed:
                continue
        try:
            reader, writer = await asyncio.open_connection(replica.host, replica.port)
        except OSError as exc:
            raise _ReplicaFailed(f"cannot connect: {exc}") from None
        return await self._exchange(replica, reader, writer, request)

    @staticmethod
    async def _exchange(
        replica: Replica, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> tuple[int, bytes]:
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status_line, fields = _headers(head[:-4])
            length = int(fields.get(b"content-length", b"0"))
            body = await reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            writer.close()
            raise _ReplicaFailed(f"{type(exc).__name__}: {exc}") from None
        if fields.get(b"connection", b"").lower() == b"close":
            writer.close()
        else:
            replica.idle.append((reader, writer))
        return int(status_line.split(" ", 2)[1]), head + body

    async def forward(self, request: bytes, prefix: bytes | None = None) -> bytes:
        tried: set[int] = set()
        while True:
            replica = self.pick(tried, prefix)
            if replica is None:
                return _response(503, _error(503, "No replica of the model server is serving."))
            tried.add(replica.index)
            replica.in_flight += 1
            try:
                _, response = await self._send(replica, request)
                replica.requests += 1
                return response
            except _ReplicaFailed as exc:
                # a replica that still runs but refused or dropped a fresh connection is dead to us
                # too: without it the next request would fail the same way
                if replica.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        replica.process.terminate()
                self.mark_dead(replica, str(exc))
            finally:
                replica.in_flight -= 1

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: requests in turn (HTTP/1.1 keep-alive)."""
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    writer.write(_response(400, _error(400, "Request head too large."), close=True))
                    return
                request_line, fields = _headers(head[:-4])
                close = fields.get(b"connection", b"").lower() == b"close" or request_line.endswith("HTTP/1.0")
                if b"transfer-encoding" in fields:
                    writer.write(_response(411, _error(411, "Send a Content-Length body."), close=True))
                    return
                length = fields.get(b"content-length", b"0")
                if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                    writer.write(_response(413, _error(413, "Missing or too large Content-Length."), close=True))
                    return
                body = await reader.readexactly(int(length))
                method, _, rest = request_line.partition(" ")
                path = rest.split(" ", 1)[0].split("?", 1)[0].rstrip("/") or "/"
                if method == "GET" and path in HEALTH_PATHS:
                    status, payload = self.health()
                    response = _response(status, payload, close=close)
                elif method == "GET" and path == STATS_PATH:
                    response = _response(200, await self.stats(), close=close)
                else:
                    prefix = prompt_start(body) if path == COMPLETIONS_PATH else None
                    response = await self.forward(head + body, prefix)
                writer.write(response)
                await writer.drain()
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()


def prompt_start(body: bytes) -> bytes | None:
    """The start of a completions request's (first) prompt, which names the prefix a replica may hold."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    prompt = payload.get("prompt") if isinstance(payload, dict) else None
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # several prompts: the first names the request
    if isinstance(prompt, str):
        return prompt[:PREFIX_KEY_CHARS].encode()
    if isinstance(prompt, list):
        return orjson.dumps(prompt[: PREFIX_KEY_CHARS // 4])
    return None


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the router dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def replica_command(options: ServeOptions, port: int) -> list[str]:
    """The argv of one replica: the same server, on `port` of 127.0.0.1, as a single process (the router
    prepared the checkpoint, published the tokenizer and holds the public port; the replica logs no access)."""
    replica = dataclasses.replace(
        options,
        port=port,
        host="127.0.0.1",
        replicas=1,
        prepare=None,
        publish_tokenizer=None,
        access_log=False,
        port_file=None,
        port_fallback=False,
        report_file=None,
    )
    return replica.to_argv(sys.executable)


def _gpu_for(index: int) -> dict[str, str]:
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return {"CUDA_VISIBLE_DEVICES": visible[index % len(visible)]} if len(visible) > 1 else {}


def start_replicas(options: Any) -> list[Replica]:
    """Start `options.replicas` servers and wait until all are healthy (DeploymentError otherwise)."""
    replicas: list[Replica] = []
    try:
        for index in range(options.replicas):
            port = free_port()
            env = {**os.environ, **_gpu_for(index)}
            process = subprocess.Popen(replica_command(options, port), env=env, preexec_fn=_die_with_parent)
            replicas.append(Replica(index=index, port=port, process=process))
        for replica in replicas:
            wait_until_healthy(f"http://127.0.0.1:{replica.port}", timeout=START_TIMEOUT, process=replica.process)
    except BaseException:
        stop_replicas(replicas)
        raise
    return replicas


def loaded_by_all(replicas: list[Replica]) -> dict[str, Any] | None:
    """What the replicas loaded (their /v1/health `checkpoint`); DeploymentError when two loaded different
    content (the tracker moved between their loads: one deployment would answer for two checkpoints)."""
    import urllib.request

    reports = []
    for replica in replicas:
        with urllib.request.urlopen(f"http://127.0.0.1:{replica.port}{routes.HEALTH}", timeout=10) as response:
            reports.append(orjson.loads(response.read()).get("checkpoint"))
    digests = {_content(r) for r in reports}
    if len(digests) > 1:
        raise DeploymentError(
            "The replicas loaded different checkpoint contents: "
            + ", ".join(f"{(r or {}).get('path')} {_content(r)[:12]}" for r in reports)
            + ".",
            hint="Pin the iteration (--iteration) so that every replica loads the same one.",
        )
    return reports[0] if reports else None


def _content(report: dict[str, Any] | None) -> str:
    return str(((report or {}).get("content") or {}).get("sha256") or "")


def stop_replicas(replicas: list[Replica], timeout: float = 30.0) -> None:
    for replica in replicas:
        if replica.process.poll() is None:
            replica.process.terminate()
    deadline = time.monotonic() + timeout
    for replica in replicas:
        try:
            replica.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            replica.process.kill()
            replica.process.wait()


def serve_replicas(
    options: Any, sock: Any, say: Callable[[str], None], *, ready: Callable[[], None] = lambda: None
) -> None:
    """Serve `options.replicas` replicas behind the listening socket `sock` until Ctrl-C or SIGTERM.

    `say` reports progress to the operator (the server's own start-up lines); `ready` is called once the
    replicas serve, before the router takes the socket (it stops the loading responder).
    """
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    started = time.perf_counter()
    say(f"Starting {options.replicas} replicas of {options.checkpoint} ...")
    replicas: list[Replica] = []
    try:
        # SIGTERM while the replicas load: stop them too (KeyboardInterrupt unwinds to the finally)
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            replicas = start_replicas(options)
        finally:
            signal.signal(signal.SIGTERM, previous)
        checkpoint = loaded_by_all(replicas)
        if options.report_file is not None and checkpoint is not None:
            from ckpteval.server.loaded import write_report

            write_report(options.report_file, checkpoint)
        router = Router(replicas, identity=getattr(options, "identity", None), checkpoint=checkpoint)
        ready()
        url = f"http://{options.host}:{sock.getsockname()[1]}"
        say(
            f"Serving '{options.served_model_name}' on {url} with {len(replicas)} replicas (ports "
            f"{', '.join(str(r.port) for r in replicas)}), ready in {time.perf_counter() - started:.1f} s. "
            "Ctrl-C stops it."
        )
        with contextlib.suppress(KeyboardInterrupt):
            _run_loop(_route(router, sock))
        say("Server stopped.")
    except KeyboardInterrupt:
        pass
    finally:
        stop_replicas(replicas)


def _run_loop(main: Any) -> None:
    try:
        import uvloop
    except ImportError:  # uvloop is optional: the stdlib loop works, a little slower
        asyncio.run(main)
    else:
        uvloop.run(main)


async def _route(router: Router, sock: Any) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    sock.listen(1024)
    server = await asyncio.start_server(router.handle, sock=sock, limit=MAX_HEAD_BYTES)
    monitor = asyncio.create_task(router.monitor())
    async with server:
        await stop.wait()
    monitor.cancel()
