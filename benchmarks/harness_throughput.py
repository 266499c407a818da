"""Is the evaluator ever the bottleneck? Harness request rate vs the model server's own capacity.

    uv run python benchmarks/harness_throughput.py [--rounds 3] [--parallelism 10] [--fewshot 0]

A log-likelihood task (hellaswag, its lm-eval YAML, offline data: 80 samples = 320 requests) runs
through `nemo-evaluator run_eval` exactly as a ckpteval job runs it, against the fast `tiny` Megatron
model (the server command is the e2e tests' `model_server_command`; a fast server is the hard case for
the evaluator). In the same round, side by side:

- capacity: a plain load generator (keep-alive HTTP, `parallelism` threads) replays the very request
  bodies the harness sent, straight to the server: requests/s the server sustains;
- harness: the run's rate at nemo-evaluator's interceptor proxy (answered requests / time from first
  to last request, from eval_factory_metrics.json);
- harness without proxy: the same task with the interceptor chain disabled (lm-eval straight to the
  server; rate from lm-eval's own progress bar), to see what the proxy costs.

A byte-level HF tokenizer matching the tiny model's tokenization is built on the fly (lm-eval needs one
for log-likelihood requests). Results go in harness_throughput.md next to this file.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.conftest import free_port, model_server_command, serve  # noqa: E402
from tests.e2e.tasks.conftest import run_task  # noqa: E402


def byte_tokenizer(path: Path) -> str:
    """An HF tokenizer whose ids are the UTF-8 bytes (what the tiny model's server uses)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    byte_to_char = dict(zip(printable, map(chr, chars), strict=True))
    tok = Tokenizer(models.BPE(vocab={byte_to_char[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=byte_to_char[0]).save_pretrained(str(path))
    return str(path)


def request_bodies(output_dir: Path, model_id: str) -> list[bytes]:
    """The completions requests lm-eval sent, rebuilt from its samples (same body, same bytes)."""
    bodies = []
    for path in output_dir.glob("*/samples_hellaswag_*.jsonl"):
        for line in path.read_text().splitlines():
            for args in json.loads(line)["arguments"].values():
                prompt = args["arg_0"] + args["arg_1"]
                payload = {
                    "model": model_id,
                    "prompt": prompt,
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
    """Rate seen at nemo-evaluator's interceptor proxy: answered requests / (last - first request time)."""
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parallelism", type=int, default=10)
    parser.add_argument("--fewshot", type=int, default=0)
    parser.add_argument("--limit", type=int, default=80)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, outputs)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ckpteval-bench-"))
    port = free_port()
    rows = []
    try:
        tokenizer = byte_tokenizer(work / "byte_tokenizer")
        with serve(model_server_command("tiny", port), port, work / "server.log") as model:
            extra = {"tokenizer": tokenizer, "tokenizer_backend": "huggingface", "num_fewshot": args.fewshot}
            params = {"limit_samples": args.limit, "parallelism": args.parallelism, "request_timeout": 600}
            for r in range(args.rounds):
                run = run_task("hellaswag", work / f"r{r}" / "proxy", url=model.url, params={**params, "extra": extra})
                assert run.returncode == 0, run.paths.log.read_text()[-2000:]
                bodies = request_bodies(run.paths.output_dir, model.model_id)
                cap_before = capacity(model.url, bodies, args.parallelism)
                harness, count = proxy_rate(run.paths.output_dir)
                direct = run_task(
                    "hellaswag",
                    work / f"r{r}" / "direct",
                    url=model.url,
                    params={**params, "extra": extra},
                    adapter_config={"interceptors": [{"name": "endpoint", "enabled": False}]},
                )
                assert direct.returncode == 0, direct.paths.log.read_text()[-2000:]
                cap_after = capacity(model.url, bodies, args.parallelism)
                rows.append(
                    {
                        "requests": count,
                        "capacity": (cap_before + cap_after) / 2,
                        "harness": harness,
                        "harness_lm_eval_bar": lm_eval_rate(run.paths.log),
                        "direct_lm_eval_bar": lm_eval_rate(direct.paths.log),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if args.keep:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    cap = statistics.median(r["capacity"] for r in rows)
    har = statistics.median(r["harness"] for r in rows)
    print(
        f"\nparallelism {args.parallelism}, few-shot {args.fewshot}, {rows[0]['requests']} requests, {len(rows)} rounds"
    )
    print(f"server capacity (median): {cap:.1f} req/s")
    print(f"harness via proxy (median): {har:.1f} req/s  ratio {har / cap:.2f}")
    print(f"lm-eval bar with proxy (median): {statistics.median(r['harness_lm_eval_bar'] for r in rows):.1f} req/s")
    print(f"lm-eval bar without proxy (median): {statistics.median(r['direct_lm_eval_bar'] for r in rows):.1f} req/s")


if __name__ == "__main__":
    main()
