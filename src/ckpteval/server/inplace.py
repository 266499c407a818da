"""Load in place: another checkpoint of the same model loaded into the running builtin server.

`evaluate watch` evaluates checkpoint after checkpoint of one training run; a fresh deployment for each pays
the process start, megatron's import and the model build every time. A server started with
`--load-secret-file` accepts `POST /v1/load` (`LOAD_ROUTE`) from whoever can read that file (mode 0600: the
job or watcher that started it, not whoever reaches the open port), and then:

1. reads the candidate's args and tokenizer and refuses (409, the server untouched) one that differs in
   architecture, tokenizer or saved parallel layout: the caller starts a fresh deployment for it;
2. closes the gate (`app.ServingGate`): new requests get 503 "loading", those in flight are answered first;
3. loads the weights into the model it holds, drops the prefix cache (its keys and values are the old
   weights'), and takes the identity the caller gives (`identity`: the new invocation's token);
4. reports the new checkpoint (`server.loaded`: /v1/health `checkpoint`, the `x-ckpteval-checkpoint` header
   on every answer, the report file) and only then serves again.

A load that fails half-way leaves the model holding no checkpoint whole: the server then serves nothing (503
"failed", no checkpoint named) until a load succeeds; it never answers with the old weights under the new
identity, nor with a mix under the old one. Asking for the checkpoint the server holds (same directory, same
content) only changes the identity: no weights are read.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import asyncio
import dataclasses
import hmac
import os
import secrets
import time
from pathlib import Path
from typing import Any

from ckpteval.errors import CkptevalError
from ckpteval.server.inplace_client import LOAD_ROUTE, SECRET_HEADER
from ckpteval.server.protocol import ApiError

__all__ = ["LOAD_ROUTE", "InPlaceLoader", "incompatibilities", "served_layout", "write_load_secret"]


def write_load_secret(path: Path) -> str:
    """A fresh secret, written to `path` readable by its owner only (created so, never widened), returned."""
    token = secrets.token_hex(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.replace(tmp, path)
    return token


def served_layout(info: Any) -> dict[str, Any]:
    """What must stay the same across loads into one server (`info`: `server.checkpoint.CheckpointInfo`): the
    architecture its args give, the tokenizer's bytes, the format and parallel layout it was saved with."""
    from ckpteval.checkpoint.tokenizer_source import tokenizer_sha256

    args = info.args
    return {
        "architecture": dataclasses.asdict(info.architecture),
        "tokenizer": tokenizer_sha256({"tokenizer": info.tokenizer_dir}),
        "format": info.layout.ckpt_format,
        "parallel layout": {
            name: getattr(args, name, 1) or 1
            for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size")
        },
    }


def incompatibilities(current: dict[str, Any], candidate: dict[str, Any]) -> list[str]:
    """Why a checkpoint (`served_layout`) cannot be loaded into a server holding another; empty: it can."""
    reasons = []
    for part in ("architecture", "parallel layout"):
        differ = sorted(
            k for k in current[part].keys() | candidate[part].keys() if current[part].get(k) != candidate[part].get(k)
        )
        if differ:
            shown = ", ".join(f"{k} {current[part].get(k)} -> {candidate[part].get(k)}" for k in differ[:4])
            reasons.append(f"another {part} ({shown}{', ...' if len(differ) > 4 else ''})")
    if current["tokenizer"] != candidate["tokenizer"]:
        reasons.append("another tokenizer (its files differ)")
    if current["format"] != candidate["format"]:
        reasons.append(f"another checkpoint format ({current['format']} -> {candidate['format']})")
    return reasons


class InPlaceLoader:
    """The `POST /v1/load` handler of one server: checks the caller's secret, then loads (module docstring)."""

    def __init__(
        self,
        *,
        secret: str,
        loaded: Any,  # serve.LoadedModel: replaced in place
        app: Any,  # app.AsgiApp
        tokenizer: str | None,
        ignore_unexpected_tensors: bool,
        prefix_cache_bytes: int | None,
        report_file: Path | None,
    ) -> None:
        self.secret = secret
        self.loaded = loaded
        self.app = app
        self.tokenizer = tokenizer
        self.ignore_unexpected_tensors = ignore_unexpected_tensors
        self.prefix_cache_bytes = prefix_cache_bytes
        self.report_file = report_file
        self.layout = served_layout(loaded.info)
        self.loads = 0
        self.intact = True  # the model holds one checkpoint whole (False after a load failed half-way)
        self._busy = asyncio.Lock()

    async def handle(self, scope: dict[str, Any], body: Any) -> tuple[int, Any]:
        """Check the secret and the body, then check (`"check": true`: only that) or load."""
        given = dict(scope.get("headers", ())).get(SECRET_HEADER.encode(), b"").decode(errors="replace")
        if not hmac.compare_digest(given.encode(), self.secret.encode()):
            raise ApiError(403, "Loading in place is for the job that started this server (its load secret).", code=403)
        if not isinstance(body, dict) or not isinstance(body.get("checkpoint"), str):
            raise ApiError(400, "'checkpoint' (a checkpoint directory) is required.", param="checkpoint")
        iteration = body.get("iteration")
        identity = body.get("identity")
        if iteration is not None and not isinstance(iteration, str):
            raise ApiError(400, "'iteration' must be a string ('1000', 'release').", param="iteration")
        if identity is not None and not isinstance(identity, str):
            raise ApiError(400, "'identity' must be a string.", param="identity")
        if self._busy.locked():
            raise ApiError(409, "Another load is in progress.", code="busy")
        async with self._busy:
            try:
                info = await asyncio.to_thread(self._read, body["checkpoint"], iteration)
            except CkptevalError as exc:
                raise ApiError(400, f"Cannot read {body['checkpoint']}: {exc.message}", code="unreadable") from None
            reasons = incompatibilities(self.layout, served_layout(info))
            if reasons:
                return 409, {
                    "loaded": False,
                    "refused": reasons,
                    **ApiError(
                        409,
                        f"{info.iter_dir} cannot be loaded into this server: "
                        + "; ".join(reasons)
                        + ". Start a fresh deployment for it.",
                        code="incompatible",
                    ).body(),
                }
            if body.get("check"):
                return 200, {"loaded": False, "compatible": True}
            return await self._load(info, iteration, identity)

    def _read(self, checkpoint: str, iteration: str | None) -> Any:
        from ckpteval.server.checkpoint import load_checkpoint_info

        return load_checkpoint_info(checkpoint, tokenizer=self.tokenizer, pinned=iteration)

    async def _load(self, info: Any, iteration: str | None, identity: str | None) -> tuple[int, Any]:
        gate, server = self.app.gate, self.app.server
        started = time.perf_counter()
        gate.close()
        await gate.drained()
        server.checkpoint = None  # nothing is named while the weights change
        self.app.name_answers()
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: torch's DCP raises it

        try:
            report, reused = await asyncio.to_thread(self._replace_weights, info, iteration)
        except (Exception, CheckpointException) as exc:  # the load's boundary: megatron's loader raises whatever
            # its storage layer does (torch DCP's CheckpointException for a truncated shard, a missing tensor): the
            # model may hold parts of two checkpoints, so nothing is served until a load succeeds
            gate.state, gate.error = "failed", _message(exc)
            self.intact = False
            server.identity = identity
            self.app.name_answers()
            return 500, {
                "loaded": False,
                "status": "failed",
                **ApiError(500, f"Loading {info.iter_dir} failed: {gate.error}", type="server_error").body(),
            }
        self.loaded.info, self.loaded.report = info, report
        self.loads += 1
        self.intact = True
        payload = report.to_json()
        if self.report_file is not None:
            from ckpteval.server.loaded import write_report

            write_report(self.report_file, payload)
        server.identity, server.checkpoint = identity, payload
        self.app.name_answers()
        gate.state, gate.error = "serving", ""
        return 200, {
            "loaded": True,
            "weights_read": not reused,
            "seconds": round(time.perf_counter() - started, 3),
            "checkpoint": payload,
        }

    def _replace_weights(self, info: Any, iteration: str | None) -> tuple[Any, bool]:
        """Runs with the gate closed and drained: the model thread is idle, nothing reads the weights."""
        from ckpteval.checkpoint.identity import content_identity
        from ckpteval.server.loaded import loaded_report
        from ckpteval.server.model import check_no_unexpected_tensors, load_weights

        loaded = self.loaded
        previous = loaded.report
        same_dir = self.intact and previous is not None and Path(previous.path) == Path(info.iter_dir)
        if same_dir and content_identity(info.iter_dir).sha256 == previous.content.sha256:
            return dataclasses.replace(previous, pinned=iteration, in_place=True), True
        model = loaded.runner.model
        check_no_unexpected_tensors(model, info.architecture, info.iter_dir, ignore=self.ignore_unexpected_tensors)
        load_weights(model, info.iter_dir)
        if self.prefix_cache_bytes is not None:  # its keys and values are the old weights'
            loaded.runner.enable_prefix_cache(self.prefix_cache_bytes)
        report = loaded_report(info, pinned=iteration, device=loaded.device, dtype=loaded.dtype)
        return dataclasses.replace(report, in_place=True), False


def _message(exc: BaseException) -> str:
    if isinstance(exc, CkptevalError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"[:500]
