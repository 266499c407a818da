"""Start-up benchmark: what a user feels on every command.

Measures, side by side in one run (interleaved, median of N):
- `evaluate --help` against a minimal Typer app's `--help` (the floor of this stack); target <= 1.5x
- `evaluate -c sft --run MY-CLUSTER --dry-run` against `nel run --dry-run` (nemo-evaluator-launcher 0.2.6)
  on an equivalent config (same six tasks, Slurm executor, generic deployment); target <= 0.25x

Run: `uv run python benchmarks/startup.py [--runs N]`. Results are appended to benchmarks/startup.md by hand
(copy the printed table). Nothing here touches a cluster: both dry runs only render.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent

BARE_APP = '''
import typer
app = typer.Typer()
@app.command()
def main(name: str = "x"):
    """A bare Typer app."""
if __name__ == "__main__":
    app()
'''

# [wandb] as a real user has it: the sft config exports to W&B and refuses to start without a project.
ENV_TOML = """
[wandb]
entity = "my-team"
project = "evals"

[MY-CLUSTER]
executor = "slurm"
host = "login.example.com"
user = "me"
account = "llm"
partition = "batch"
remote_job_dir = "/lustre/me/ckpteval"
container_image = "nvcr.io/nvidia/nemo:25.11"
"""

NEL_CONFIG = """
defaults:
  - execution: slurm/default
  - deployment: generic
  - _self_
execution:
  hostname: login.example.com
  username: me
  account: llm
  output_dir: /lustre/me/ckpteval/evaluations
deployment:
  image: nvcr.io/nvidia/nemo:25.11
  command: python /opt/Export-Deploy/scripts/deploy/nlp/deploy_ray_inframework.py --megatron_checkpoint /checkpoint
  served_model_name: megatron-model
  checkpoint_path: /lustre/ckpt
  port: 8000
  endpoints: {completions: /v1/completions/, chat: /v1/chat/completions/, health: /v1/health}
target:
  api_endpoint:
    api_key_name: null
evaluation:
  nemo_evaluator_config:
    config:
      params:
        parallelism: 8
        extra: {tokenizer: /lustre/ckpt/tokenizer, tokenizer_backend: huggingface}
  tasks:
    - name: adlr_mmlu
    - name: hellaswag
    - name: adlr_arc_challenge_llama_25_shot
    - name: adlr_winogrande_5_shot
    - name: gsm8k
    - name: adlr_humaneval_greedy
"""


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "bare.py").write_text(BARE_APP)
        (work / "env.toml").write_text(ENV_TOML)
        (work / "nel.yaml").write_text(NEL_CONFIG)
        env = {**os.environ, "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0", "HOME": str(work), "XDG_STATE_HOME": str(work)}
        pairs = {
            "help": (
                [str(BIN / "evaluate"), "--help"],
                [sys.executable, "bare.py", "--help"],
            ),
            "dry-run": (
                [str(BIN / "evaluate"), "-c", "sft", "--run", "MY-CLUSTER", "--dry-run", "run.model=/lustre/ckpt"],
                [str(BIN / "nel"), "run", "--config", "nel.yaml", "--dry-run"],
            ),
        }
        results: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in pairs}
        for name, (ours, base) in pairs.items():
            timed(ours, work, env), timed(base, work, env)  # warm the page cache and .pyc files
            for _ in range(args.runs):
                results[name][0].append(timed(ours, work, env))
                results[name][1].append(timed(base, work, env))
    print("| measurement | ckpteval median (s) | baseline | baseline median (s) | ratio | target |")
    print("|---|---|---|---|---|---|")
    labels = {"help": ("bare Typer app --help", "<= 1.5"), "dry-run": ("nel run --dry-run", "<= 0.25")}
    for name, (ours, base) in results.items():
        o, b = statistics.median(ours), statistics.median(base)
        label, target = labels[name]
        print(f"| {name} | {o:.2f} | {label} | {b:.2f} | {o / b:.2f} | {target} |")


if __name__ == "__main__":
    main()
