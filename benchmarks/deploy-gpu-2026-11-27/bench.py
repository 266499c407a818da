"""benchmarks/deploy_bench.py unchanged, run with two additions for the GPU session (main's files untouched):

- GPUBENCH_PREFIX_CACHE=off starts this tree's servers (and a router's replicas) with --no-prefix-cache. The
  bench sends the same requests in every measurement, so with the cache on (the default since 1f525d5) every
  measurement after the first is answered from the cache, not computed; the baseline server has no cache.
- With --replicas other than 1, the shape's report is printed once before the replica runs as well, so a
  time-out during them loses only the replica table.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "head" / "benchmarks"))  # main at HEAD (head/COMMIT)
import deploy_bench

import ckpteval.deploy.launch as launch

serve_command = launch.serve_command
server_init = deploy_bench.Server.__init__
replica_scaling = deploy_bench.replica_scaling


def init(self, checkpoint, device, *, batch, source, replicas=1):
    off = os.environ.get("GPUBENCH_PREFIX_CACHE", "on") == "off" and source is None
    launch.serve_command = (lambda **kw: serve_command(**{**kw, "prefix_cache": False})) if off else serve_command
    try:
        server_init(self, checkpoint, device, batch=batch, source=source, replicas=replicas)
    finally:
        launch.serve_command = serve_command


def scaling(checkpoint, args, bodies, clients):
    out = sys._getframe(1).f_locals.get("out")
    if args.replicas != [1] and out:
        print(
            "\n".join([*out, "", "(replica runs next; this shape's report is printed again in full after them)", ""]),
            flush=True,
        )
    return replica_scaling(checkpoint, args, bodies, clients)


deploy_bench.Server.__init__ = init
deploy_bench.replica_scaling = scaling
if __name__ == "__main__":  # megatron's checkpoint writer starts spawn processes, which import this file again
    cache = os.environ.get("GPUBENCH_PREFIX_CACHE", "on")
    print(f"[gpubench] prefix cache of this tree's servers: {cache}", flush=True)
    deploy_bench.main()
