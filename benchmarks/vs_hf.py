"""The embedded default against upstream lm-eval + Hugging Face transformers on the same CPU (issue 45).

    uv run python benchmarks/vs_hf.py --limit 3 --rounds 2          # 171 items (3 per MMLU subject)

Side by side, interleaved (ckpteval, upstream, ckpteval, upstream, ...), on the same machine:

- ckpteval: `evaluate -c tiny --limit N` exactly as a user runs it (5-shot `adlr_mmlu` = lm-eval's
  `mmlu_str`, SmolLM2-135M-Instruct in float32 served on the CPU by the builtin megatron-core server,
  lm-eval's `local-completions` through nemo-evaluator, the harness hook, the packaged MMLU data);
- upstream: `lm_eval --model hf --batch_size 8` of upstream lm-eval 0.4.13 (its own venv, made here with
  uv), on the same float32 weights (the packaged GGUF dequantized by transformers, the very weights the
  Megatron checkpoint was converted from, saved as a Hugging Face directory), the same task YAML
  (nvidia-lm-eval's `mmlu/str_default`, passed with --include_path), the same data (the harness hook's
  packaged MMLU, offline) and the same 5 shots.

`adlr_mmlu` is a generation task (each item: one prompt, 2 greedy tokens, the letter compared). Each run
records its wall clock, the CPU seconds of its whole process tree (server and clients included), the load
average before and after, and each item's prompt and answer: the prompts and answers of every run must be
identical. Load-independent measures: the distinct tokens of the prompts' prefix tree (the floor: every
shared prefix computed once), the prompt tokens HF's forwards take (longest first, batches of 8, left-padded),
and the prompt tokens ckpteval's server computed and served from its prefix cache (the exit line of its
deployment log). Results go in vs_hf.md; a 171-item round (both sides) takes ~7 minutes on a quiet 2-core
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
UPSTREAM_LM_EVAL = "0.4.13"
HOOK_DIR = REPO / "src" / "ckpteval" / "tasks" / "harness_hook"
SUMMARY = re.compile(r"Prompt tokens: (\d+), computed (\d+), from the prefix cache (\d+)")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def upstream_venv(work: Path) -> Path:
    """A venv with upstream lm-eval (and this venv's torch/transformers versions): made once with uv.

    This venv's site-packages come after its own on sys.path (a .pth file): the harness hook's data patches
    import ckpteval and the packaged data from there, while `lm_eval` is upstream's."""
    import torch
    import transformers

    venv = work / "upstream-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(["uv", "venv", "-q", str(venv), "-p", sys.executable], check=True)
        subprocess.run(
            [
                "uv",
                "pip",
                "install",
                "-q",
                "--python",
                str(python),
                f"lm-eval[hf]=={UPSTREAM_LM_EVAL}",
                f"torch=={torch.__version__.split('+')[0]}",
                f"transformers=={transformers.__version__}",
            ],
            check=True,
        )
        site = venv / "lib" / f"python{python_version()}" / "site-packages"
        ours = Path(sys.prefix) / "lib" / f"python{python_version()}" / "site-packages"
        (site / "zz_ckpteval_fallback.pth").write_text(f"{ours}\n{REPO / 'src'}\n")
    return python


def hf_weights(work: Path) -> Path:
    """The float32 SmolLM2-135M-Instruct the checkpoint was converted from, as a Hugging Face directory."""
    out = work / "smollm2-hf-fp32"
    if not (out / "config.json").exists():
        from transformers import AutoModelForCausalLM

        from ckpteval.server.packaged import load_smollm2_hf

        tokenizer, model = load_smollm2_hf()  # float32, dequantized from the GGUF
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the weights are plain float32 now: saved as such
        plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
        plain.load_state_dict(model.state_dict())
        plain.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
    return out


def task_yaml_dir(work: Path) -> Path:
    """nvidia-lm-eval's `mmlu_str` YAML (what `adlr_mmlu` runs), less its `instruction:` key, which upstream's
    TaskConfig does not know and which is used only with --add_instruction (the job does not pass it): the
    prompts are the same, and the script checks that they are."""
    import lm_eval

    source = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "str_default"
    out = work / "mmlu_str"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out)
    template = out / "_default_template_yaml"
    lines = template.read_text().splitlines(keepends=True)
    template.write_text("".join(line for line in lines if not line.startswith("instruction:")))
    return out


def run_tree(argv: list[str], *, env: dict[str, str], log: Path, cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process tree) of one command, its output in `log`.

    The CPU seconds are this process's RUSAGE_CHILDREN before and after: every descendant that its parent
    waited for, counted once (summing each process's own and children's times would count a child at every
    ancestor)."""
    import resource

    def children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    cpu_before = children_cpu()
    start = time.perf_counter()
    with log.open("w") as out:
        returncode = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd).returncode
    wall = time.perf_counter() - start
    if returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({returncode}); see {log}")
    return wall, children_cpu() - cpu_before


def samples(samples_dir: Path) -> dict[tuple[str, int], tuple[str, str]]:
    """(subject, doc_id) -> (its prompt, its answer after lm-eval's filters: the letter it generated)."""
    out = {}
    for path in samples_dir.rglob("samples_*.jsonl"):
        subject = re.sub(r"^samples_|_\d{4}-.*$", "", path.stem)
        for line in path.read_text().splitlines():
            sample = json.loads(line)
            (args,) = sample["arguments"].values()
            out[(subject, sample["doc_id"])] = (args["arg_0"], str(sample["filtered_resps"][0]))
    return out


def token_counts(prompts: list[str], tokenizer_dir: Path) -> dict[str, int]:
    """Load-independent work: the prompts' tokens, their prefix tree's distinct tokens (the floor: every shared
    prefix computed once), and the prompt tokens HF's forwards take (longest first in batches of 8, each row
    left-padded to its batch's longest: what its `generate_until` does with --batch_size 8)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    lengths = []
    trie: dict[int, Any] = {}
    distinct = 0
    for prompt in prompts:
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        lengths.append(len(ids))
        node = trie
        for t in ids:
            if t not in node:
                node[t] = {}
                distinct += 1
            node = node[t]
    rows = sorted(lengths, reverse=True)
    padded = sum(len(rows[i : i + 8]) * rows[i] for i in range(0, len(rows), 8))
    return {"prompt_tokens": sum(rows), "distinct": distinct, "hf_padded": padded}


def run_ckpteval(args: argparse.Namespace, work: Path, round_: int) -> dict[str, Any]:
    out = work / f"ckpteval-{round_}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    argv = [
        sys.executable,
        "-m",
        "ckpteval.cli",
        "-c",
        "tiny",
        "--limit",
        str(args.limit),
        f"execution.output_dir={out}",
        *args.ckpteval_override,
    ]
    before = load()
    wall, cpu = run_tree(argv, env=dict(os.environ), log=out / "evaluate.log", cwd=REPO)
    (job,) = [p for p in out.iterdir() if p.is_dir()]
    found = SUMMARY.findall((job / "logs" / "deployment.log").read_text())
    prompt, computed, cached = (int(x) for x in found[-1]) if found else (0, 0, 0)
    return {
        "wall": wall,
        "cpu": cpu,
        "load": f"{before} / {load()}",
        "samples": samples(job / "tasks"),
        "prompt_tokens": prompt,
        "computed": computed,
        "cached": cached,
    }


def run_upstream(args: argparse.Namespace, work: Path, round_: int, python: Path, weights: Path) -> dict[str, Any]:
    out = work / f"upstream-{round_}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(HOOK_DIR),  # its sitecustomize: the packaged MMLU data, offline (as the job's client)
        CKPTEVAL_OFFLINE_DATA="on",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    argv = [
        str(python),
        "-m",
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={weights},dtype=float32",
        "--tasks",
        "mmlu_str",
        "--include_path",
        str(task_yaml_dir(work)),
        "--num_fewshot",
        "5",
        "--limit",
        str(args.limit),
        "--batch_size",
        "8",
        "--device",
        "cpu",
        "--log_samples",
        "--output_path",
        str(out),
    ]
    before = load()
    wall, cpu = run_tree(argv, env=env, log=out / "lm_eval.log", cwd=work)
    return {"wall": wall, "cpu": cpu, "load": f"{before} / {load()}", "samples": samples(out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=3, help="items per MMLU subject (3: 171 items)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ckpteval-vs-hf"))
    parser.add_argument("--only", choices=["ckpteval", "upstream"], help="run one side only")
    parser.add_argument("--ckpteval-override", action="append", default=[], help="a Hydra override for evaluate")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    python = upstream_venv(args.work)
    weights = hf_weights(args.work)
    rows: list[tuple[int, str, dict[str, Any]]] = []
    for round_ in range(1, args.rounds + 1):
        sides = ["ckpteval", "upstream"] if round_ % 2 else ["upstream", "ckpteval"]
        for side in sides:
            if args.only and side != args.only:
                continue
            print(f"round {round_}: {side} (load {load()})", file=sys.stderr, flush=True)
            result = (
                run_ckpteval(args, args.work, round_)
                if side == "ckpteval"
                else run_upstream(args, args.work, round_, python, weights)
            )
            rows.append((round_, side, result))
            print(f"  {side}: {result['wall']:.1f} s, CPU {result['cpu']:.0f} s", file=sys.stderr, flush=True)
    report(args, rows, weights)


def report(args: argparse.Namespace, rows: list[tuple[int, str, dict[str, Any]]], weights: Path) -> None:
    first = rows[0][2]["samples"]
    counts = token_counts([prompt for prompt, _ in first.values()], weights)
    print(f"\n### {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: 5-shot MMLU (mmlu_str), {len(first)} items")
    print(
        f"\n--limit {args.limit} per subject; upstream lm-eval {UPSTREAM_LM_EVAL} --model hf --batch_size 8; "
        f"{os.cpu_count()} CPUs\n"
    )
    print(
        "| round | side | load before / after | wall s | CPU s | prompt tokens computed | from the cache | hit rate |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for round_, side, r in rows:
        if side == "ckpteval":
            hit = r["cached"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0
            work = f"{r['computed']} | {r['cached']} | {hit:.0%}"
        else:
            work = f"{counts['prompt_tokens']} ({counts['hf_padded']} padded) | - | -"
        print(f"| {round_} | {side} | {r['load']} | {r['wall']:.1f} | {r['cpu']:.0f} | {work} |")
    print()
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for round_, side, r in rows:
        by_round.setdefault(round_, {})[side] = r
    everything = [r["samples"] for _, _, r in rows]
    prompts_same = all({k: p for k, (p, _) in x.items()} == {k: p for k, (p, _) in first.items()} for x in everything)
    answers_same = all({k: a for k, (_, a) in x.items()} == {k: a for k, (_, a) in first.items()} for x in everything)
    print(f"- every run: the same {len(first)} prompts: {prompts_same}; the same answers: {answers_same}")
    differ = sorted({k for x in everything for k, (p, _) in x.items() if p != first.get(k, (None,))[0]})
    for subject, doc in differ:  # the harnesses' few-shot samplers can pick other examples for a document
        print(f"  - prompt differs between runs: {subject} document {doc}")
    for round_, sides in sorted(by_round.items()):
        if len(sides) == 2:
            c, u = sides["ckpteval"], sides["upstream"]
            wall, cpu = c["wall"] / u["wall"], c["cpu"] / u["cpu"]
            print(f"- round {round_}: ckpteval / upstream: wall {wall:.2f}, CPU {cpu:.2f}")
    ck = [r for _, s, r in rows if s == "ckpteval"]
    print(
        f"- prompts' tokens {counts['prompt_tokens']}, distinct prefix-tree tokens (the floor) {counts['distinct']}; "
        + "".join(f"ckpteval computed {r['computed'] / counts['distinct']:.2f}x the floor; " for r in ck)
        + f"HF's prompt forwards {counts['prompt_tokens'] / counts['distinct']:.2f}x "
        f"({counts['hf_padded'] / counts['distinct']:.2f}x padded)"
    )


if __name__ == "__main__":
    main()
