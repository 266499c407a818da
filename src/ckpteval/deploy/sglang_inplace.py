"""Loading the next checkpoint into a running SGLang server: its `/update_weights_from_disk`, with the export of
that checkpoint.

A kept SGLang server (started once, its port written in a *load directory*: `<dir>/port`) serves the export of one
checkpoint under the weight version it was given (the identity of the invocation it serves: `--weight-version`).
An invocation with `deployment.load_into=<dir>` starts no server: its deployment step (after the export step made
the export of its checkpoint) runs `python -m ckpteval.deploy.sglang_inplace` (`stand_in`), which

1. reads what the server holds (`/get_model_info`: `model_path`, `weight_version`) and refuses an export of
   another architecture or tokenizer (config.json's fields, the tokenizer files' bytes): SGLang reads the new
   directory's tensors into the model it built (a tensor it lacks is left as it was, names it does not know
   fail), and keeps its tokenizer, so only the same model with other weights may be loaded; the caller starts a
   fresh deployment for it;
2. posts `{"model_path": <export>, "weight_version": <the invocation's identity>}` to `/update_weights_from_disk`
   (SGLang waits for the requests in flight, blocks new ones until the weights are in, and drops its prefix
   cache) and requires `{"success": true}`, then that `/get_model_info` names the export and the identity;
3. writes the server's port where the job reads it and stands for the deployment until the job stops it (the
   server goes on).

A failed load leaves the server's weight version as it was (SGLang changes it only on success), so nothing is
served under the new identity: the job's identity check refuses the endpoint. What SGLang then holds is not
known whole (it rolls back by reading the old path again), so `evaluate watch` stops a kept server after a
failed load. SGLang's route takes no secret: whoever reaches the port can ask it to load (its `--api-key`
would close the OpenAI routes too); the job's identity check is what ties the answers to the invocation.
Stdlib only: it runs in the job.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.errors import CkptevalError, DeploymentError

PORT_FILE = "port"
LOAD_ROUTE = "/update_weights_from_disk"
INFO_ROUTE = "/get_model_info"
# config.json fields that say nothing of the architecture (where the export came from, how it was written)
NOT_ARCHITECTURE = frozenset({"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache"})
# what SGLang's tokenizer is built from; it is not reloaded by a load from disk
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Loaded:
    """What the server reports after a successful load."""

    model_path: str
    weight_version: str
    message: str


def server_url(directory: Path) -> str:
    """The base URL of the kept SGLang server whose load directory `directory` is."""
    try:
        port = int((directory / PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        raise DeploymentError(
            f"No SGLang server that loads in place runs from {directory} (no port written there).",
            hint="Start a fresh deployment instead (drop deployment.load_into).",
        ) from None
    return f"http://127.0.0.1:{port}"


def _call(url: str, body: dict[str, Any] | None = None, timeout: float = 3600.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="GET" if body is None else "POST"
    )
    try:
        with _DIRECT.open(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise DeploymentError(f"The SGLang server at {url} did not answer: {getattr(exc, 'reason', exc)}.") from None
    try:
        return status, json.loads(raw or b"{}")
    except json.JSONDecodeError:
        return status, {"message": raw.decode(errors="replace")[:300]}


def model_info(base_url: str) -> dict[str, Any]:
    """The server's `/get_model_info` (model_path, tokenizer_path, weight_version, ...)."""
    status, info = _call(base_url + INFO_ROUTE, timeout=30)
    if status != 200 or not isinstance(info, dict):
        raise DeploymentError(f"{base_url}{INFO_ROUTE} answered HTTP {status}: it is no SGLang server to load into.")
    return info


def _architecture(directory: Path) -> dict[str, Any]:
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DeploymentError(f"{directory} is no Hugging Face directory (config.json: {exc}).") from None
    return {k: v for k, v in config.items() if k not in NOT_ARCHITECTURE}


def _tokenizer(directory: Path) -> dict[str, str]:
    out = {}
    for name in TOKENIZER_FILES:
        path = directory / name
        if path.is_file():
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def incompatibilities(current: Path, candidate: Path) -> list[str]:
    """Why the export `candidate` cannot be loaded into a server built from the export `current`; empty: it can."""
    reasons = []
    a, b = _architecture(current), _architecture(candidate)
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if differ:
        shown = ", ".join(f"{k} {a.get(k)} -> {b.get(k)}" for k in differ[:4])
        reasons.append(f"another architecture ({shown}{', ...' if len(differ) > 4 else ''})")
    if _tokenizer(current) != _tokenizer(candidate):
        reasons.append("another tokenizer (its files differ)")
    return reasons


def load_export(directory: Path, export: Path, *, identity: str, timeout: float = 3600.0) -> Loaded:
    """Load `export` into the kept server of `directory` under `identity` (the module docstring); DeploymentError
    when it is refused (another architecture or tokenizer: a fresh deployment is the way) or fails."""
    base = server_url(directory)
    export = export.resolve()
    held = model_info(base)
    current = Path(str(held.get("model_path") or ""))
    reasons = incompatibilities(current, export)
    if reasons:
        raise DeploymentError(
            f"{export} cannot be loaded into the kept SGLang server (it holds {current}): " + "; ".join(reasons) + ".",
            hint="Start a fresh deployment for this checkpoint (drop deployment.load_into).",
        )
    status, answer = _call(base + LOAD_ROUTE, {"model_path": str(export), "weight_version": identity}, timeout=timeout)
    message = str(answer.get("message") or "") if isinstance(answer, dict) else ""
    if status != 200 or not (isinstance(answer, dict) and answer.get("success") is True):
        raise DeploymentError(
            f"The kept SGLang server did not load {export} (HTTP {status}): {message or 'no message'}. Its weight "
            f"version is still {held.get('weight_version')!r}: nothing is served under this job's identity.",
            hint="Start a fresh deployment for this checkpoint (drop deployment.load_into).",
        )
    now = model_info(base)
    if now.get("weight_version") != identity or Path(str(now.get("model_path") or "")).resolve() != export:
        raise DeploymentError(
            f"After loading, the kept SGLang server reports {now.get('model_path')} under weight version "
            f"{now.get('weight_version')!r}, not {export} under {identity!r} (another load came between)."
        )
    return Loaded(model_path=str(export), weight_version=identity, message=message)


def stand_in(directory: Path, export: Path, *, identity: str, port_file: Path | None) -> None:
    """The deployment step of a job whose deployment loads into a kept SGLang server: load, write the port to
    `port_file` (as a server it started would), then wait until SIGTERM or Ctrl-C."""
    from ckpteval.server.announce import publish_port, say

    say(f"Loading {export} in place into the SGLang server of {directory} ...")
    loaded = load_export(directory, export, identity=identity)
    port = server_url(directory).rsplit(":", 1)[1]
    if port_file is not None:
        publish_port(port_file, int(port))
    say(
        f"Loaded in place ({loaded.message}): {loaded.model_path} as weight version {identity}, serving on port "
        f"{port}. Standing for it until stopped."
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _s, _f: stop.set())
    stop.wait()
    say("Stopped (the SGLang server goes on serving).")


def main(argv: list[str] | None = None) -> int:
    """`python -m ckpteval.deploy.sglang_inplace --load-into DIR --model-path EXPORT --identity ID
    [--port-file FILE]`; errors as one line (and a hint), exit 1."""
    parser = argparse.ArgumentParser(prog="python -m ckpteval.deploy.sglang_inplace")
    parser.add_argument("--load-into", type=Path, required=True)
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--port-file", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        stand_in(args.load_into, args.model_path, identity=args.identity, port_file=args.port_file)
    except CkptevalError as exc:
        print(f"Error: {exc.message}" + (f"\n{exc.hint}" if exc.hint else ""), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
