"""The builtin server's prefix cache: tokens computed against the floor, wall clock, scores, memory.

    uv run python benchmarks/prefix_cache.py [--limit 20] [--fewshot 10] [--parallelism 4]

hellaswag runs through `nemo-evaluator run_eval` exactly as a ckpteval job runs it (the harness hook
included, so the requests of one context are sent together), against SmolLM2-135M served by the builtin
server on the CPU, once with `--no-prefix-cache` and once with the cache, in the same run. For each:
the task's wall clock, the server's own counters (`/v1/stats`: prompt tokens, tokens computed, tokens
from the cache), its peak RSS (VmHWM) and the cache's peak bytes against its budget.

The floor is the least any server can compute: the number of nodes of the prefix tree of the very token
sequences the harness sent (rebuilt from lm-eval's samples: the prompt is context + continuation,
tokenized by the server's own /tokenize). Scores and every request's log-likelihood are compared
between the two runs. Last, a bare fp32 matmul of the model's MLP shape, timed in the same run, says
what fraction of this CPU's matmul throughput the server's forward reached (2 x parameters FLOPs a token).

Prints a markdown record (load average before and after); results go in prefix_cache.md next to this file.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.deploy_support import free_port, request_json  # noqa: E402
from tests.e2e.conftest import packaged_checkpoint  # noqa: E402
from tests.e2e.tasks.conftest import TaskRun, start_task  # noqa: E402

from ckpteval.tasks.runconfig import TaskPaths  # noqa: E402

CLIENT_TIMEOUT_S = 4 * 3600  # a loaded 2-core machine takes long; the client is killed after this


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def samples(output_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(output_dir.glob("*/samples_hellaswag_*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return sorted(out, key=lambda s: s["doc_id"])


def prompts(rows: list[dict[str, Any]]) -> list[str]:
    return [args["arg_0"] + args["arg_1"] for row in rows for args in row["arguments"].values()]


def tree_nodes(sequences: list[list[int]]) -> int:
    """Distinct prefixes of `sequences` (nodes of their token tree, the root excluded)."""
    root: dict[int, Any] = {}
    count = 0
    for seq in sequences:
        node = root
        for token in seq:
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                count += 1
            node = child
    return count


def loglikelihoods(rows: list[dict[str, Any]]) -> list[float]:
    return [float(r[0][0]) for row in rows for r in row["resps"]]


def run_one(cache: bool, checkpoint: Path, work: Path, params: dict[str, Any]) -> dict[str, Any]:
    from ckpteval.server.launch import start_local_server

    port = free_port()
    server = start_local_server(
        checkpoint=checkpoint,
        port=port,
        log_path=work / "server.log",
        served_model_name="megatron-model",
        device="cpu",
        timeout=600,
        prefix_cache=cache,
    )
    try:
        started = time.monotonic()
        client = start_task("hellaswag", work / "task", url=server.url + "/v1/completions", params=params)
        try:
            returncode = client.wait(timeout=CLIENT_TIMEOUT_S)
        finally:
            if client.poll() is None:  # the client and what it started (the harness)
                import psutil

                for process in [*psutil.Process(client.pid).children(recursive=True), psutil.Process(client.pid)]:
                    process.kill()
                client.wait()
        run = TaskRun(returncode, TaskPaths(work / "task"), time.monotonic() - started)
        if run.returncode != 0:
            raise RuntimeError(run.paths.log.read_text()[-3000:])
        _, stats = request_json("GET", server.url + "/v1/stats")
        rows = samples(run.paths.output_dir)
        texts = prompts(rows)
        tokens = [request_json("POST", server.url + "/tokenize", {"prompt": t})[1]["tokens"] for t in texts]
        rss = peak_rss_mib(server.process.pid)
    finally:
        server.stop()
    return {
        "seconds": run.seconds,
        "stats": stats,
        "rss_mib": rss,
        "rows": rows,
        "tokens": tokens,
        "acc": sum(float(r["acc"]) for r in rows) / len(rows),
        "acc_norm": sum(float(r["acc_norm"]) for r in rows) / len(rows),
    }


def matmul_gflops(hidden: int = 576, ffn: int = 1536, tokens: int = 512, repeat: int = 50) -> float:
    """fp32 GFLOP/s of a bare [tokens, hidden] x [hidden, ffn] matmul (SmolLM2-135M's MLP shape)."""
    import torch

    a, b = torch.randn(tokens, hidden), torch.randn(hidden, ffn)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(repeat):
        a @ b
    return 2 * tokens * hidden * ffn * repeat / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=20, help="hellaswag items (4 requests each)")
    parser.add_argument("--fewshot", type=int, default=10)
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    checkpoint = packaged_checkpoint("smol")
    params = {
        "limit_samples": args.limit,
        "parallelism": args.parallelism,
        "request_timeout": 3600,
        "extra": {
            "tokenizer": str(checkpoint / "tokenizer"),
            "tokenizer_backend": "huggingface",
            "num_fewshot": args.fewshot,
        },
    }
    work = Path(tempfile.mkdtemp(prefix="ckpteval-prefix-"))
    load_before, started = load_average(), time.strftime("%Y-%m-%d %H:%M")
    try:
        off = run_one(False, checkpoint, work / "off", params)
        print("off", json.dumps({k: v for k, v in off.items() if k not in ("rows", "tokens")}), flush=True)
        on = run_one(True, checkpoint, work / "on", params)
        print("on", json.dumps({k: v for k, v in on.items() if k not in ("rows", "tokens")}), flush=True)
        gflops = matmul_gflops()
    finally:
        if args.keep:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    load_after = load_average()
    floor = tree_nodes(on["tokens"])
    total = sum(len(t) for t in on["tokens"])
    diff = max(abs(a - b) for a, b in zip(loglikelihoods(off["rows"]), loglikelihoods(on["rows"]), strict=True))
    params_count = 134.5e6  # SmolLM2-135M
    lines = [
        f"### {started} UTC: hellaswag, {args.limit} items x 4 requests, {args.fewshot}-shot, "
        f"parallelism {args.parallelism}, SmolLM2-135M fp32 on the CPU",
        "",
        f"load average before {load_before}, after {load_after}; floor (distinct prefix-tree tokens) {floor}, "
        f"prompt tokens {total} ({total / floor:.2f}x the floor)",
        "",
        "| | cache off | cache on | on / off |",
        "|---|---|---|---|",
    ]
    for label, key in (("prompt tokens", "prompt_tokens"), ("tokens computed", "computed_tokens")):
        a, b = off["stats"][key], on["stats"][key]
        lines.append(f"| {label} | {a} | {b} | {b / a:.3f} |")
    lines.append(
        f"| tokens computed / floor | {off['stats']['computed_tokens'] / floor:.2f}x | "
        f"{on['stats']['computed_tokens'] / floor:.2f}x | |"
    )
    lines.append(f"| tokens from the cache | {off['stats']['cached_tokens']} | {on['stats']['cached_tokens']} | |")
    lines.append(
        f"| task wall clock | {off['seconds']:.0f} s | {on['seconds']:.0f} s | {on['seconds'] / off['seconds']:.2f} |"
    )
    lines.append(f"| server peak RSS | {off['rss_mib']:.0f} MiB | {on['rss_mib']:.0f} MiB | |")
    budget = on["stats"].get("prefix_cache_budget_bytes", 0) / 2**20
    peak = on["stats"].get("prefix_cache_peak_bytes", 0) / 2**20
    lines.append(f"| cache peak / budget | - | {peak:.0f} / {budget:.0f} MiB | |")
    lines.append(
        f"| acc, acc_norm | {off['acc']:.4f}, {off['acc_norm']:.4f} | {on['acc']:.4f}, {on['acc_norm']:.4f} | |"
    )
    lines.append(
        f"| server's time in forwards | {off['stats']['model_seconds']:.0f} s | {on['stats']['model_seconds']:.0f} s | "
        f"{on['stats']['model_seconds'] / off['stats']['model_seconds']:.2f} |"
    )
    rates = [run["stats"]["computed_tokens"] / run["stats"]["model_seconds"] for run in (off, on)]
    lines.append(f"| tokens computed per second in forwards | {rates[0]:.0f} | {rates[1]:.0f} | |")
    achieved = [2 * params_count * rate / 1e9 for rate in rates]
    lines.append(
        f"| that x 2 x parameters, GFLOP/s, and share of a bare fp32 matmul ({gflops:.0f} GFLOP/s) | "
        f"{achieved[0]:.1f} ({achieved[0] / gflops:.0%}) | {achieved[1]:.1f} ({achieved[1] / gflops:.0%}) | |"
    )
    lines.append("")
    lines.append(f"largest difference of a request's log-likelihood, on vs off: {diff:.2e}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
