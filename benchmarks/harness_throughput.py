"""Is the evaluator ever the bottleneck? Harness request rate vs the model server's own capacity.

    uv run python benchmarks/harness_throughput.py [--rounds 3] [--parallelism 10] [--fewshot 0]

A log-likelihood task (hellaswag, its lm-eval YAML, offline data: 80 samples = 320 requests) runs
through `nemo-evaluator run_eval` exactly as a ckpteval job runs it, against the fast `tiny` Megatron
model (the server command is the e2e tests' `model_server_command`; a fast server is the hard case for
the evaluator). In the same round, side by side:

- capacity: a plain load generator (keep-alive HTTP, `parallelism` threads) replays the very request
  bodies the harness sent, straight to the server: requests/s the server sustains;
- harness, with ckpteval's default for lm-eval tasks (no proxy; the harness hook keeps the response cache,
  progress and stats): answered requests / time from first to last request, from the `response_stats`
  the hook writes into eval_factory_metrics.json, and lm-eval's own progress bar;
- the same through nemo-evaluator's interceptor proxy with the chain that was the default before
  (`proxy_adapter_config`: the rate at the proxy), with a minimal chain (caching + endpoint), and with
  neither proxy nor hook (lm-eval alone; its progress bar), to see what the proxy and the hook cost.

The same measurements against an instant fake endpoint give the evaluator's own ceiling on this machine.

lm-eval needs an HF tokenizer for log-likelihood requests: the served checkpoint's own
(`<checkpoint>/tokenizer`; the tiny model's is byte-level). The script prints a markdown record (per
round, medians, ratios to capacity, load average); results go in harness_throughput.md next to this file.
"""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.conftest import free_port, model_server_command, serve  # noqa: E402
from tests.e2e.tasks.conftest import run_task  # noqa: E402

from ckpteval.tasks.runconfig import NO_PROXY_ADAPTER_CONFIG, EndpointSpec, proxy_adapter_config  # noqa: E402


def checkpoint_tokenizer(kind: str) -> str:
    """The served checkpoint's own HF tokenizer dir (the tiny model's is byte-level: ids 0-255, EOS 256)."""
    from tests.e2e.conftest import packaged_checkpoint

    path = packaged_checkpoint(kind) / "tokenizer"  # type: ignore[arg-type]
    if not (path / "tokenizer.json").is_file():
        raise RuntimeError(f"no HF tokenizer in {path}")
    return str(path)


def request_bodies(output_dir: Path, model_id: str) -> list[bytes]:
    """The completions requests lm-eval sent, rebuilt from its samples (same body, same bytes).

    nemo-evaluator runs lm-eval's `local-completions` with `tokenized_requests=False`: lm-eval tokenizes
    context and continuation with the HF tokenizer, then sends them decoded back to text, one prompt per
    request. With a lossless tokenizer and prompts far below lm-eval's 2048-token max_length (hellaswag:
    at most ~700 byte tokens) that text is context + continuation.
    """
    bodies = []
    for path in output_dir.glob("*/samples_hellaswag_*.jsonl"):
        for line in path.read_text().splitlines():
            for args in json.loads(line)["arguments"].values():
                payload = {
                    "model": model_id,
                    "prompt": args["arg_0"] + args["arg_1"],
                    "temperature": 0,
                    "max_tokens": 1,
                    "logprobs": 1,
                    "stream": False,
                    "seed": 1234,
                    "echo": True,
                }
                bodies.append(json.dumps(payload).encode())
    return bodies


def capacity(url: str, bodies: list[bytes], parallelism: int) -> float:
    """Requests/s the server answers when `parallelism` keep-alive clients replay `bodies`."""
    parts = urlsplit(url)
    queue = list(enumerate(bodies))
    lock = threading.Lock()
    errors: list[str] = []

    def worker() -> None:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
        while True:
            with lock:
                if not queue:
                    break
                _, body = queue.pop()
            conn.request("POST", parts.path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                errors.append(data[:200].decode())
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(parallelism)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"server errors: {errors[:3]}")
    return len(bodies) / elapsed


def proxy_rate(output_dir: Path) -> tuple[float, int]:
    """Rate in `response_stats` (the proxy's, or the hook's): answered requests / (last - first request time)."""
    stats = json.loads((output_dir / "eval_factory_metrics.json").read_text())["response_stats"]
    (run,) = stats["inference_run_times"].values()
    first = time.mktime(time.strptime(run["first_request_time"].split(".")[0], "%Y-%m-%dT%H:%M:%S"))
    first += float("0." + run["first_request_time"].split(".")[1])
    last = time.mktime(time.strptime(run["last_request_time"].split(".")[0], "%Y-%m-%dT%H:%M:%S"))
    last += float("0." + run["last_request_time"].split(".")[1])
    return stats["count"] / (last - first), int(stats["count"])


_TQDM = re.compile(r"Requesting API: 100%[^0-9]*(\d+)/\1 \[[\d:]+<[\d:]+, +([\d.]+)(it/s|s/it)\]")


def lm_eval_rate(log: Path) -> float:
    """The final rate of lm-eval's "Requesting API" progress bar."""
    found = _TQDM.findall(log.read_text(errors="replace").replace("\r", "\n"))
    if not found:
        raise RuntimeError(f"no final progress line in {log}")
    _, value, unit = found[-1]
    return float(value) if unit == "it/s" else 1.0 / float(value)


FAKE_ENDPOINT = REPO / "tests" / "e2e" / "tasks" / "fake_endpoint.py"
PROXY_CHAIN = "proxy chain"  # filled in per run: proxy_adapter_config(output_dir, endpoint)
CHAINS: dict[str, dict[str, Any] | str | None] = {
    "default (hook; no proxy)": None,  # ckpteval's (runconfig.default_adapter_config)
    "proxy chain (old default)": PROXY_CHAIN,
    "caching + endpoint only": {
        "interceptors": [{"name": "caching", "config": {"reuse_cached_responses": True}}, {"name": "endpoint"}]
    },
    "lm-eval alone": NO_PROXY_ADAPTER_CONFIG,  # run without the hook's variables
}
TIMED = ("default (hook; no proxy)", "proxy chain (old default)")  # the ones that write response_stats


def measure(
    url: str, model_id: str, work: Path, params: dict[str, Any], chains: dict[str, dict[str, Any] | str | None]
) -> dict[str, float]:
    """One round against one server: capacity, then each chain, then capacity again."""
    parallelism = int(params["parallelism"])
    out: dict[str, float] = {}
    bodies: list[bytes] = []
    for name, chain in chains.items():
        task_dir = work / re.sub(r"[^A-Za-z0-9]+", "_", name)
        if chain == PROXY_CHAIN:
            endpoint = EndpointSpec(url=url, model_id=model_id, type="completions")
            chain = proxy_adapter_config(str(task_dir / "artifacts"), endpoint)
        elif isinstance(chain, dict) and chain["interceptors"][0]["name"] == "caching":
            chain = copy.deepcopy(chain)
            chain["interceptors"][0]["config"]["cache_dir"] = str(task_dir / "artifacts" / "cache")
        assert not isinstance(chain, str)
        run = run_task(
            "hellaswag", task_dir, url=url, params=params, adapter_config=chain, hook=name != "lm-eval alone"
        )
        assert run.returncode == 0, run.paths.log.read_text()[-2000:]
        if not bodies:
            bodies = request_bodies(run.paths.output_dir, model_id)
            out["capacity before"] = capacity(url, bodies, parallelism)
        out[f"{name}: lm-eval bar"] = lm_eval_rate(run.paths.log)
        if name in TIMED:
            out[f"{name}: response_stats"] = proxy_rate(run.paths.output_dir)[0]
    out["capacity after"] = capacity(url, bodies, parallelism)
    out["capacity"] = (out["capacity before"] + out["capacity after"]) / 2
    out["requests"] = len(bodies)
    return out


def load_average() -> str:
    """The 1-minute load average (the machine is shared; rates move with it)."""
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> None:
    """Run the rounds and print a markdown record: raw numbers per round, medians, ratios to capacity."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["tiny", "smol"], default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parallelism", type=int, default=10)
    parser.add_argument("--fewshot", type=int, default=0)
    parser.add_argument("--limit", type=int, default=80)
    parser.add_argument("--chains", default=",".join(CHAINS), help="comma-separated subset of: " + ", ".join(CHAINS))
    parser.add_argument("--no-ceiling", action="store_true", help="skip the instant fake endpoint")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, outputs)")
    args = parser.parse_args()
    chains = {name: CHAINS[name] for name in args.chains.split(",")}
    work = Path(tempfile.mkdtemp(prefix="ckpteval-bench-"))
    model_label = {"tiny": "tiny Megatron model", "smol": "SmolLM2-135M (Megatron)"}[args.model]
    results: dict[str, list[dict[str, float]]] = {model_label: []}
    if not args.no_ceiling:
        results["instant fake endpoint"] = []
    load_before = load_average()
    started = time.strftime("%H:%M")
    port, fake_port = free_port(), free_port()
    fake = subprocess.Popen([sys.executable, str(FAKE_ENDPOINT), "--port", str(fake_port)])
    try:
        with serve(model_server_command(args.model, port), port, work / "server.log") as model:
            extra = {
                "tokenizer": checkpoint_tokenizer(args.model),
                "tokenizer_backend": "huggingface",
                "num_fewshot": args.fewshot,
            }
            params = {"limit_samples": args.limit, "parallelism": args.parallelism, "request_timeout": 3600}
            params["extra"] = extra
            targets = {model_label: model.url, "instant fake endpoint": f"http://127.0.0.1:{fake_port}/v1/completions"}
            for r in range(args.rounds):
                for label in results:
                    row = measure(targets[label], model.model_id, work / f"r{r}" / label.split()[0], params, chains)
                    row["load"] = float(load_average())
                    results[label].append(row)
                    print(label, json.dumps(row), flush=True)
    finally:
        fake.kill()
        fake.wait()
        if args.keep:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(render(results, args, started, load_before, load_average()))


def render(
    results: dict[str, list[dict[str, float]]], args: argparse.Namespace, started: str, before: str, after: str
) -> str:
    """Markdown: per target, one row per round (requests/s) and the median of the per-round ratios."""
    lines = [
        f"## Run ({started}, load {before} → {after})",
        "",
        f"Machine: {os.uname().machine}, {os.cpu_count()} cores. Command: "
        f"`uv run python benchmarks/harness_throughput.py --model {args.model} --rounds {args.rounds} "
        f"--parallelism {args.parallelism} --fewshot {args.fewshot} --limit {args.limit} --chains {args.chains!r}`",
    ]
    for label, rows in results.items():
        keys = [k for k in rows[0] if k not in ("requests", "capacity", "load")]
        rates = [k for k in keys if not k.startswith("capacity")]
        lines += [
            "",
            f"#### {label} (hellaswag, {args.fewshot}-shot, {int(rows[0]['requests'])} requests per run, "
            f"parallelism {args.parallelism}), requests/s",
            "",
            "| round | load | " + " | ".join(keys) + " | " + " | ".join(f"{k} / capacity" for k in rates) + " |",
            "|" + "---|" * (2 + len(keys) + len(rates)),
        ]
        for i, row in enumerate(rows, 1):
            cap = row["capacity"]
            lines.append(
                f"| {i} | {row['load']:.1f} | "
                + " | ".join(f"{row[k]:.1f}" for k in keys)
                + " | "
                + " | ".join(f"{row[k] / cap:.2f}" for k in rates)
                + " |"
            )
        medians = [statistics.median(r[k] for r in rows) for k in keys]
        ratios = [statistics.median(r[k] / r["capacity"] for r in rows) for k in rates]
        lines.append(
            "| median | | "
            + " | ".join(f"{v:.1f}" for v in medians)
            + " | "
            + " | ".join(f"**{v:.2f}**" for v in ratios)
            + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
