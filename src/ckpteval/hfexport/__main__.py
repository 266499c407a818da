"""`python -m ckpteval.hfexport cached ...`: the job step that exports a Megatron checkpoint for vLLM or SGLang.

    python -m ckpteval.hfexport cached CKPT --cache DIR --link PATH --report FILE [--dtype D]
                                           [--tokenizer T] [--pinned ITERATION]

Export into the cache (or find the export there), check parity, point PATH at the directory to serve and
write what happened to FILE (JSON, for results' provenance). A refusal is one line, `error: ...` (what
differs, then the hint on the next line), and exit code 3: the job stops before the engine starts.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed, not to break a cycle.
import argparse
import json
import os
import sys
from pathlib import Path

from ckpteval.errors import CkptevalError

REFUSED = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ckpteval.hfexport")
    commands = parser.add_subparsers(dest="command", required=True)
    cached = commands.add_parser("cached", help="Export into the cache (or reuse), check, link.")
    cached.add_argument("checkpoint")
    cached.add_argument("--cache", required=True)
    cached.add_argument("--link", required=True, type=Path)
    cached.add_argument("--report", required=True, type=Path)
    cached.add_argument("--dtype", default="checkpoint")
    cached.add_argument("--tokenizer", default=None)
    cached.add_argument("--pinned", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the step; return the process exit code."""
    from ckpteval.hfexport.cache import export_into_cache

    args = _parser().parse_args(argv)

    def note(message: str) -> None:
        print(f"export: {message}", flush=True)

    try:
        from ckpteval.server.runtime import quiet_library_logs

        quiet_library_logs()
        done = export_into_cache(
            args.checkpoint,
            args.cache,
            link=args.link,
            dtype=args.dtype,
            tokenizer=args.tokenizer,
            pinned=args.pinned,
            on_note=note,
        )
    except CkptevalError as exc:
        print(f"error: {' '.join(exc.message.split())}", flush=True)
        if exc.hint:
            print(exc.hint, flush=True)
        return REFUSED
    except KeyboardInterrupt:
        return 130
    args.report.parent.mkdir(parents=True, exist_ok=True)
    staging = args.report.with_name(f".{args.report.name}.{os.getpid()}")
    staging.write_text(json.dumps(done.to_json(), indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(staging, args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
