"""A local stand-in for the Hugging Face Hub: the part of its HTTP API that `huggingface_hub` and `datasets`
use to download a dataset repository, served from directories on disk (`HF_ENDPOINT` points at it).

Each repository is a directory `<root>/<owner>/<name>` (or `<root>/<name>`) holding the repository's files
in their real layout (README.md with its YAML `configs`, parquet files). Routes, as the hub answers them:
- `GET /api/datasets/<repo>[/revision/<rev>]`: the repository's info (sha, siblings, gated, ...);
- `GET /api/datasets/<repo>/tree/<rev>[/<path>]`: a listing (`recursive=true` for all files);
- `POST /api/datasets/<repo>/paths-info/<rev>`: the entries of the paths asked for;
- `HEAD|GET /datasets/<repo>/resolve/<rev>/<path>`: a file, with `ETag`, `X-Repo-Commit`, ranges;
- an unknown repository or file is a 404 with `X-Error-Code: RepoNotFound` / `EntryNotFound`;
  a repository listed in `gated` answers 401 `X-Error-Code: GatedRepo` to file downloads, as the hub does
  for a user who has not accepted its terms.
`requests` records every request (method, path) so tests can count them; `stop()` makes it unreachable.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up before reading the whole answer (a HEAD-then-GET, a cut-off fetch) is
        normal traffic for the hub, not an error: say nothing, as the hub does. Anything else is a bug of the
        stand-in and is printed."""
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipeError, ConnectionResetError, ...
            return
        super().handle_error(request, client_address)


class HubStandIn:
    """A threaded HTTP server on 127.0.0.1 serving dataset repositories from `root`."""

    def __init__(self, root: Path, *, gated: tuple[str, ...] = (), aliases: dict[str, str] | None = None) -> None:
        self.root = root
        self.gated = set(gated)
        self.aliases = dict(aliases or {})
        self.delays: dict[str, float] = {}  # file name -> seconds to wait before serving it (to cut a fetch off)
        self.requests: list[tuple[str, str]] = []
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        """Shut the server down and close its socket: from now on nothing answers at `url`."""
        self._server.shutdown()
        self._server.server_close()

    def repo_dir(self, repo: str) -> Path | None:
        path = self.root / repo
        return path if path.is_dir() and ".." not in repo else None

    def files(self, repo: str) -> Iterator[tuple[str, Path]]:
        base = self.repo_dir(repo)
        if base is None:
            return
        for path in sorted(base.rglob("*")):
            if path.is_file():
                yield path.relative_to(base).as_posix(), path


def _oid(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _split_repo(rest: str) -> tuple[str, str]:
    """`owner/name/...` or `name/...`: the repo id and what follows (the hub's ids have at most one slash)."""
    parts = rest.split("/")
    for n in (2, 1):
        yield_id = "/".join(parts[:n])
        if yield_id and parts[n : n + 1] in (["revision"], ["tree"], ["paths-info"], ["resolve"], []):
            return yield_id, "/".join(parts[n:])
    return "/".join(parts[:2]), "/".join(parts[2:])


def _handler(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, data: Any) -> None:
            self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

        def _not_found(self, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self._send(
                404, body, {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
            )

        def _entry(self, rel: str, path: Path) -> dict[str, Any]:
            if path.is_dir():
                return {"type": "directory", "path": rel, "oid": "0" * 40, "size": 0}
            return {"type": "file", "path": rel, "oid": _oid(path), "size": path.stat().st_size}

        def _route(self) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(parsed.path)
            query = urllib.parse.parse_qs(parsed.query)
            hub.requests.append((self.command, path))
            if path.startswith("/api/datasets/"):
                return self._api(path[len("/api/datasets/") :], query)
            if path.startswith("/datasets/"):
                return self._resolve(path[len("/datasets/") :])
            self._not_found("RepoNotFound", f"not served: {path}")

        def _redirect(self, prefix: str, repo: str, tail: str) -> bool:
            """A legacy id without a namespace (`hellaswag`) moved to its owner's: 307, as the hub answers."""
            if repo not in hub.aliases:
                return False
            location = f"{prefix}{hub.aliases[repo]}" + (f"/{tail}" if tail else "")
            query = urllib.parse.urlsplit(self.path).query
            self._send(307, b"", {"Location": location + (f"?{query}" if query else "")})
            return True

        def _api(self, rest: str, query: dict[str, list[str]]) -> None:
            repo, tail = _split_repo(rest)
            if self._redirect("/api/datasets/", repo, tail):
                return
            base = hub.repo_dir(repo)
            if base is None:
                return self._not_found("RepoNotFound", f"Repository Not Found for url: {self.path}")
            if tail == "" or tail.startswith("revision/"):
                return self._json(
                    {
                        "_id": hashlib.sha1(repo.encode()).hexdigest()[:24],
                        "id": repo,
                        "sha": COMMIT,
                        "private": False,
                        "gated": "manual" if repo in hub.gated else False,
                        "disabled": False,
                        "lastModified": "2024-01-01T00:00:00.000Z",
                        "tags": [],
                        "downloads": 0,
                        "likes": 0,
                        "cardData": {},
                        "siblings": [{"rfilename": rel} for rel, _ in hub.files(repo)],
                    }
                )
            if tail.startswith("tree/"):
                _, _rev, *sub = tail.split("/", 2)
                prefix = sub[0].strip("/") if sub else ""
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                start = base / prefix if prefix else base
                if not start.exists():
                    return self._not_found("EntryNotFound", f"{prefix} does not exist")
                items = start.rglob("*") if recursive else start.iterdir()
                entries = [self._entry(p.relative_to(base).as_posix(), p) for p in sorted(items)]
                return self._json(entries)
            if tail.startswith("paths-info/"):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode()
                if "json" in (self.headers.get("Content-Type") or ""):
                    paths = json.loads(body or "{}").get("paths", [])
                else:
                    paths = urllib.parse.parse_qs(body).get("paths", [])
                found = [self._entry(p, base / p) for p in paths if (base / p).exists()]
                return self._json(found)
            self._not_found("RepoNotFound", f"not served: {self.path}")

        def _resolve(self, rest: str) -> None:
            repo, tail = _split_repo(rest)
            if self._redirect("/datasets/", repo, tail):
                return
            base = hub.repo_dir(repo)
            if base is None:
                return self._not_found("RepoNotFound", f"Repository Not Found for url: {self.path}")
            if repo in hub.gated:
                message = f"Access to dataset {repo} is restricted. You must have access to it and be authenticated."
                return self._send(401, message.encode(), {"X-Error-Code": "GatedRepo", "X-Error-Message": message})
            _, _rev, rel = tail.split("/", 2)
            file = base / rel
            if not file.is_file():
                return self._not_found("EntryNotFound", f"{rel} does not exist on {repo}")
            if self.command == "GET" and file.name in hub.delays:
                time.sleep(hub.delays[file.name])
            data = file.read_bytes()
            headers = {
                "ETag": f'"{_oid(file)}"',
                "X-Repo-Commit": COMMIT,
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            ranged = self.headers.get("Range")
            if ranged and ranged.startswith("bytes="):
                lo, _, hi = ranged[6:].partition("-")
                start, end = int(lo or 0), int(hi) if hi else len(data) - 1
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                return self._send(206, data[start : end + 1], headers)
            self._send(200, data, headers)

        do_GET = do_HEAD = do_POST = _route

    return Handler
