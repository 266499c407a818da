#!/usr/bin/env python3
"""A stand-in for Export-Deploy's `scripts/deploy/llm/mlm/deploy_ray.py` (v0.6.0) on the test cluster.

The NeMo image of the integration tests "has" it at /opt/Export-Deploy/scripts/deploy/llm/mlm/deploy_ray.py:
the fake pyxis runs a step on the node's own filesystem, and tests/infra/setup.sh installs it there.

It takes exactly the real script's arguments (names, short forms, types, defaults, in its order) and does
with Ray what the real one does: join the job's Ray cluster (`address="auto"`) or start a local one,
start Serve on --host/--port, deploy one application named --model_id with --num_replicas replicas, each
given num_gpus // num_replicas GPUs and --num_cpus_per_replica CPUs, `max_ongoing_requests` twice
--max_batch_size, with Export-Deploy's routes (`/v1/completions/`, `/v1/chat/completions/`, `/v1/models`,
`/v1/health`); stop Serve and Ray on SIGINT/SIGTERM. What differs: each replica serves the checkpoint with
ckpteval's builtin engine on CPU, not Megatron's inference engine on its GPUs.
"""

import argparse
import logging
import multiprocessing
import os
import signal
import sys

LOGGER = logging.getLogger("NeMo")


def get_available_cpus():
    """Get the total number of available CPUs in the system."""
    return multiprocessing.cpu_count()


def parse_args():
    """Parse command-line arguments for the Ray deployment script (Export-Deploy v0.6.0's, in shape)."""
    parser = argparse.ArgumentParser(description="Deploy a Megatron model using Ray")
    parser.add_argument(
        "--megatron_checkpoint", type=str, default=None, help="Path to the Megatron checkpoint directory"
    )
    parser.add_argument("--num_gpus", type=int, default=1, help="Number of GPUs to use per node")
    parser.add_argument(
        "--tensor_model_parallel_size", type=int, default=1, help="Size of the tensor model parallelism"
    )
    parser.add_argument(
        "--pipeline_model_parallel_size", type=int, default=1, help="Size of the pipeline model parallelism"
    )
    parser.add_argument(
        "-nlfps",
        "--num_layers_in_first_pipeline_stage",
        default=None,
        type=int,
        help="Number of layers in the first pipeline stage",
    )
    parser.add_argument(
        "-nllps",
        "--num_layers_in_last_pipeline_stage",
        default=None,
        type=int,
        help="Number of layers in the last pipeline stage",
    )
    parser.add_argument(
        "--expert_model_parallel_size", type=int, default=1, help="Size of the expert model parallelism"
    )
    parser.add_argument("--context_parallel_size", type=int, default=1, help="Size of the context parallelism")
    parser.add_argument(
        "-eps",
        "--account_for_embedding_in_pipeline_split",
        default=False,
        action="store_true",
        help="Account for embedding in the pipeline split",
    )
    parser.add_argument(
        "-lps",
        "--account_for_loss_in_pipeline_split",
        default=False,
        action="store_true",
        help="Account for loss in the pipeline split",
    )
    parser.add_argument(
        "--model_id", type=str, default="megatron-model", help="Identifier for the model in the API responses"
    )
    parser.add_argument("--host", type=str, default="0.0.0.0", help="Host address to bind the Ray Serve server to")
    parser.add_argument("--port", type=int, default=1024, help="Port number to use for the Ray Serve server")
    parser.add_argument(
        "--num_cpus",
        type=int,
        default=None,
        help="Number of CPUs to allocate for the Ray cluster. If None, will use all available CPUs.",
    )
    parser.add_argument("--num_cpus_per_replica", type=float, default=8, help="Number of CPUs per model replica")
    parser.add_argument("--include_dashboard", action="store_true", help="Whether to include the Ray dashboard")
    parser.add_argument(
        "--cuda_visible_devices", type=str, default=None, help="Comma-separated list of CUDA visible devices"
    )
    parser.add_argument(
        "--enable_cuda_graphs", action="store_true", help="Whether to enable CUDA graphs for faster inference"
    )
    parser.add_argument("--enable_flash_decode", action="store_true", help="Whether to enable Flash Attention decode")
    parser.add_argument("--num_replicas", type=int, default=1, help="Number of replicas for the deployment")
    parser.add_argument("--legacy_ckpt", action="store_true", help="Whether to use legacy checkpoint format")
    parser.add_argument("--max_batch_size", type=int, default=32, help="Maximum batch size for inference")
    parser.add_argument("--random_seed", type=int, default=None, help="Random seed for reproducible inference")
    parser.add_argument("--model_type", type=str, default="gpt", help="Type of model to load")
    parser.add_argument("--micro_batch_size", type=int, default=None, help="Micro batch size for model execution")
    parser.add_argument(
        "--batch_wait_timeout_s",
        type=float,
        default=0.1,
        help="Max seconds to wait for additional requests before processing a batch",
    )
    return parser.parse_args()


# Export-Deploy's routes (its FastAPI app's, trailing slashes included) and the builtin server's path for each
ROUTES = {
    ("POST", "/v1/completions/"): "/v1/completions",
    ("POST", "/v1/chat/completions/"): "/v1/chat/completions",
    ("GET", "/v1/models"): "/v1/models",
    ("GET", "/v1/health"): None,
}


# The stand-in's health answers 503 until the driver has asked the replicas which Slurm node they run on and
# logged it (the real script is healthy as soon as Serve is): a job whose task finishes within seconds of
# health would otherwise stop the deployment before that line is written. To the job this is a slightly
# longer model load.
READY_FLAG, READY_NAMESPACE = "ckpteval_spread_logged", "ckpteval_stand_in"


def make_ready_flag():
    """A Ray actor holding whether the spread is logged (False until `set`)."""
    import ray

    @ray.remote(num_cpus=0)
    class ReadyFlag:
        def __init__(self):
            self.value = False

        def set(self):
            self.value = True

        def get(self):
            return self.value

    return ReadyFlag.options(name=READY_FLAG, namespace=READY_NAMESPACE).remote()


def make_deployment(model_id, checkpoint, max_batch_size):
    """The Serve deployment: Export-Deploy's routes in front of ckpteval's builtin engine.

    The real script puts a FastAPI app in front (`@serve.ingress(app)`); Serve pickles that app, which
    FastAPI 0.163+ (its telemetry holds a lock) no longer allows, so the stand-in routes in `__call__` and
    answers as FastAPI would: a known path with or without its trailing slash is redirected (307) to the
    route's own spelling, an unknown one is a 404, a known one with the wrong method a 405.
    """
    from ray import serve

    @serve.deployment
    class MegatronRayDeployable:
        def __init__(self):
            from pathlib import Path

            from ckpteval.server.serve import build_app, load_model

            loaded = load_model(Path(checkpoint), device="cpu")
            asgi, self.scheduler = build_app(loaded, served_model_name=model_id, max_batch_size=max_batch_size)
            self.routes = asgi.routes
            self.node = os.environ.get("SLURMD_NODENAME", "?")
            self.checked = False

        async def __call__(self, request):
            from starlette.responses import JSONResponse, RedirectResponse, Response

            from ckpteval.server.protocol import ApiError

            path, method = request.url.path, request.method
            if (method, path) not in ROUTES:
                other = path[:-1] if path.endswith("/") else path + "/"
                if (method, other) in ROUTES:
                    return RedirectResponse(str(request.url.replace(path=other)), status_code=307)
                if any(p in (path, other) for _, p in ROUTES):
                    return JSONResponse({"detail": "Method Not Allowed"}, status_code=405)
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            target = ROUTES[(method, path)]
            if target is None:
                if not await self.spread_checked():
                    return JSONResponse({"status": "starting"}, status_code=503)
                return JSONResponse({"status": "healthy"})
            body = await request.json() if method == "POST" else None
            try:
                answer = await self.routes[target][method](body)
            except ApiError as exc:
                return JSONResponse(exc.body(), status_code=exc.status)
            return answer if isinstance(answer, Response) else JSONResponse(answer)

        def slurm_node(self):
            return self.node

        async def spread_checked(self):
            """Whether the driver has logged which Slurm nodes answer (the stand-in's health waits for it)."""
            if not self.checked:
                import ray

                self.checked = await ray.get_actor(READY_FLAG, namespace=READY_NAMESPACE).get.remote()
            return self.checked

    return MegatronRayDeployable


def main():
    """Deploy like Export-Deploy's DeployRay.deploy_inframework_model, and wait for a signal."""
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import ray
    from ray import serve

    runtime_env = {"env_vars": {"CUDA_VISIBLE_DEVICES": args.cuda_visible_devices}} if args.cuda_visible_devices else {}
    try:
        ray.init(address="auto", ignore_reinit_error=True, runtime_env=runtime_env)
        LOGGER.info("Connected to the Ray cluster")
    except ConnectionError:
        LOGGER.info("No existing Ray cluster found. Starting a local Ray cluster...")
        ray.init(
            num_cpus=args.num_cpus or get_available_cpus(),
            num_gpus=args.num_gpus,
            include_dashboard=args.include_dashboard,
            ignore_reinit_error=True,
            runtime_env=runtime_env,
        )

    def stop(*_):
        LOGGER.info("Received interrupt signal. Shutting down gracefully...")
        for step in (serve.shutdown, ray.shutdown):
            try:
                step()
            except Exception as exc:
                LOGGER.warning(f"Error during {step.__name__}(): {exc}")
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    gpus_per_replica = args.num_gpus // args.num_replicas
    LOGGER.info(f"Configuration: {args.num_replicas} replicas, {gpus_per_replica} GPUs per replica")
    serve.start(http_options={"host": args.host, "port": args.port})
    deployment = make_deployment(args.model_id, args.megatron_checkpoint, args.max_batch_size)
    app = deployment.options(
        num_replicas=args.num_replicas,
        ray_actor_options={"num_cpus": args.num_cpus_per_replica, "num_gpus": gpus_per_replica},
        max_ongoing_requests=args.max_batch_size * 2,
    ).bind()
    ready = make_ready_flag()
    handle = serve.run(app, name=args.model_id)
    nodes = sorted({handle.slurm_node.remote().result() for _ in range(8 * args.num_replicas)})
    alive = [n for n in ray.nodes() if n["Alive"]]
    LOGGER.info(f"Ray cluster of {len(alive)} nodes; replicas answer from Slurm nodes {','.join(nodes)}")
    ray.get(ready.set.remote())
    LOGGER.info(f"Megatron model deployed successfully at {args.host}:{args.port}")
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
