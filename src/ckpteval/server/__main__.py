"""`python -m ckpteval.server`: the entry point job scripts run (no `evaluate` console script needed).

    python -m ckpteval.server serve --checkpoint DIR --port 8000 [--prepare smollm2] ...
    python -m ckpteval.server prepare smollm2|tiny [--output DIR] [--force]
    python -m ckpteval.server build-packaged NAME DIR      (internal: the child `prepare` starts)

Errors are printed as one line (plus a hint) with a non-zero exit code, like the CLI.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import argparse
import sys
from pathlib import Path

from ckpteval.errors import CkptevalError


def _parser() -> argparse.ArgumentParser:
    from ckpteval.server.prepare import PACKAGED_MODELS
    from ckpteval.server.serve import DEFAULT_MODEL_NAME

    parser = argparse.ArgumentParser(prog="python -m ckpteval.server")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="Serve a Megatron checkpoint behind an OpenAI-compatible API.")
    serve.add_argument("--checkpoint", required=True, type=Path)
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--served-model-name", default=DEFAULT_MODEL_NAME)
    serve.add_argument("--device", default="auto")
    serve.add_argument("--dtype", default="auto")
    serve.add_argument("--max-batch-size", type=int, default=None)
    serve.add_argument("--max-batch-tokens", type=int, default=None, help="padded tokens per scoring forward")
    serve.add_argument(
        "--replicas", type=int, default=1, help="server processes behind this port, each request to the least busy"
    )
    serve.add_argument(
        "--no-prefix-cache",
        dest="prefix_cache",
        action="store_false",
        help="compute every token of every request (the prefix cache is on by default)",
    )
    serve.add_argument(
        "--prefix-cache-mib",
        type=int,
        default=None,
        help="memory the prefix cache may hold, in MiB (default 1024)",
    )
    serve.add_argument(
        "--tokenizer", default=None, help="a Hugging Face tokenizer dir or hub id (default: the checkpoint's)"
    )
    serve.add_argument(
        "--publish-tokenizer",
        type=Path,
        default=None,
        help="first write the tokenizer served with, as a Hugging Face directory, here (the task clients read it)",
    )
    serve.add_argument(
        "--prepare",
        choices=PACKAGED_MODELS,
        default=None,
        help="prepare this packaged model into --checkpoint first if missing",
    )
    serve.add_argument("--access-log", action="store_true")
    serve.add_argument(
        "--identity", default=None, help="a token naming this deployment, reported by /v1/health and /v1/models"
    )
    serve.add_argument("--port-file", type=Path, default=None, help="write the port held here as soon as it is held")
    serve.add_argument(
        "--port-fallback",
        action="store_true",
        help="if --port is taken, serve on a port the kernel assigns (with --port-file, to tell the clients)",
    )

    prepare = commands.add_parser("prepare", help="Write a packaged model as a Megatron checkpoint.")
    prepare.add_argument("name", choices=PACKAGED_MODELS)
    prepare.add_argument("--output", type=Path, default=None)
    prepare.add_argument("--force", action="store_true")

    build = commands.add_parser("build-packaged")
    build.add_argument("name", choices=PACKAGED_MODELS)
    build.add_argument("directory", type=Path)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; return the process exit code."""
    from ckpteval.notices import show_notices

    args = _parser().parse_args(argv)
    show_notices()
    try:
        if args.command == "serve":
            from ckpteval.server.serve import DEFAULT_PREFIX_CACHE_MIB, ServeOptions, hold_port, serve

            options = ServeOptions(
                checkpoint=args.checkpoint,
                port=args.port,
                host=args.host,
                served_model_name=args.served_model_name,
                device=args.device,
                dtype=args.dtype,
                max_batch_size=args.max_batch_size,
                max_batch_tokens=args.max_batch_tokens,
                replicas=args.replicas,
                tokenizer=args.tokenizer,
                access_log=args.access_log,
                prefix_cache=args.prefix_cache,
                prefix_cache_mib=DEFAULT_PREFIX_CACHE_MIB if args.prefix_cache_mib is None else args.prefix_cache_mib,
                identity=args.identity,
                port_file=args.port_file,
                port_fallback=args.port_fallback,
            )
            # the port first: held (and answering "loading") through the slow steps below
            sock = hold_port(options)
            try:
                if args.prepare:
                    from ckpteval.server.prepare import ensure_prepared

                    ensure_prepared(args.prepare, args.checkpoint)
                if args.publish_tokenizer:
                    from ckpteval.server.checkpoint import publish_tokenizer

                    publish_tokenizer(args.checkpoint, args.publish_tokenizer, tokenizer=args.tokenizer)
            except BaseException:
                sock.close()
                raise
            serve(options, sock)
        elif args.command == "prepare":
            from ckpteval.server.prepare import default_checkpoint_dir, prepare_checkpoint

            path = prepare_checkpoint(args.name, args.output or default_checkpoint_dir(args.name), force=args.force)
            print(path)
        else:
            from ckpteval.server.packaged import build_packaged

            build_packaged(args.name, args.directory)
    except CkptevalError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(exc.hint, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
