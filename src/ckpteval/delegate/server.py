"""The eval delegate's HTTP service: `GET /health`, `POST /evaluate` (slime's skills-server protocol).

- `GET /health` -> 200 `{"status": "ok"}`, also while an evaluation runs.
- `POST /evaluate` -> 200 with the job id, `raw_metrics` (benchmark -> mode -> metric) and `metrics`
  (`eval/<benchmark>/<mode>/<metric>`); 400 `{"error": ...}` for a malformed request or one that
  names something that cannot be evaluated (an unknown benchmark); 500 `{"error", "log_tail", "job_id"}`
  when the evaluation ran and failed. The call blocks until the evaluation ends (slime's client waits
  with its own timeout); requests arriving meanwhile wait for the running one (one thread each).
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ckpteval.delegate.protocol import RequestError, parse_request
from ckpteval.delegate.service import Delegate, DelegateSettings, EvaluationFailed
from ckpteval.errors import ConfigError, EvaluationError

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 1 << 20


def _handler(delegate: Delegate) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            log.info("%s %s", self.address_string(), format % args)

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/health":
                self._send(HTTPStatus.OK, {"status": "ok"})
            else:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}; try GET /health, POST /evaluate"})

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/evaluate":
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}; try POST /evaluate"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"body larger than {MAX_BODY_BYTES} bytes"})
                return
            body = self.rfile.read(length)
            try:
                request = parse_request(body)
            except RequestError as exc:
                self._send(HTTPStatus.BAD_REQUEST, {"error": f"invalid request: {exc}"})
                return
            try:
                self._send(HTTPStatus.OK, delegate.evaluate(request))
            except ConfigError as exc:
                self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            except EvaluationFailed as exc:
                log.warning("rollout %s: %s", request.rollout_id, exc.message)
                self._send(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    {"error": exc.message, "job_id": exc.job_id, "log_tail": exc.log_tail},
                )
            except EvaluationError as exc:  # a results file that cannot be read, ...
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": str(exc), "log_tail": ""})

    return Handler


def make_server(settings: DelegateSettings, *, host: str, port: int) -> ThreadingHTTPServer:
    """The service bound to host:port (port 0: a free port, see `server.server_address`); not yet serving."""
    server = ThreadingHTTPServer((host, port), _handler(Delegate(settings)))
    server.daemon_threads = True
    return server


def serve(settings: DelegateSettings, *, host: str, port: int, judge: str = "") -> None:
    """Serve until interrupted (Ctrl-C / SIGINT); `judge`: the judge of judged benchmarks, in words."""
    server = make_server(settings, host=host, port=port)
    log.info("eval delegate on http://%s:%s (results under %s)", host, server.server_address[1], settings.output_root)
    if judge:
        log.info("judge of judged benchmarks: %s", judge)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
