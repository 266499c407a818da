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
from typing import cast

from ckpteval.errors import CkptevalError


def _parser() -> argparse.ArgumentParser:
    from ckpteval.server.options import ServeOptions
    from ckpteval.server.prepare import PACKAGED_MODELS

    parser = argparse.ArgumentParser(prog="python -m ckpteval.server")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="Serve a Megatron checkpoint behind an OpenAI-compatible API.")
    ServeOptions.add_arguments(serve)

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
            from ckpteval.server.options import ServeOptions
            from ckpteval.server.serve import hold_port, serve

            options = ServeOptions.from_args(args)
            if options.load_into is not None:  # no server of its own: the kept one loads the checkpoint
                from ckpteval.server.inplace_client import stand_in

                if options.publish_tokenizer:
                    from ckpteval.server.checkpoint import publish_tokenizer

                    publish_tokenizer(
                        options.checkpoint,
                        options.publish_tokenizer,
                        tokenizer=options.tokenizer,
                        pinned=options.iteration,
                    )
                stand_in(options)
                return 0
            # the port first: held (and answering "loading") through the slow steps below
            sock = hold_port(options)
            try:
                if options.prepare:
                    from ckpteval.server.prepare import PackagedModel, ensure_prepared

                    # argparse took it from PACKAGED_MODELS (the flag's choices)
                    ensure_prepared(cast("PackagedModel", options.prepare), options.checkpoint)
                if options.publish_tokenizer:
                    from ckpteval.server.checkpoint import publish_tokenizer

                    publish_tokenizer(
                        options.checkpoint,
                        options.publish_tokenizer,
                        tokenizer=options.tokenizer,
                        pinned=options.iteration,
                    )
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
