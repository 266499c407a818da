"""An OpenAI-shaped judge over real HTTP, for tests of judge-scored tasks.

It serves `/v1/models` (its model id) and `/v1/chat/completions`, counts the requests it gets, keeps
their bodies, and answers each with a verdict in MT-Bench's format (`Rating: [[7]]`); with `garbage_every`
= n, every n-th reply is text no judge parser can read; with `garbage_every_prompt` = n, every reply to the
n-th, 2n-th, ... distinct prompt it is asked to judge (so a harness that asks again gets garbage again: one
judgment in n fails for good).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class JudgeStandIn:
    model_id: str = "judge-standin"
    rating: int = 7
    garbage_every: int = 0
    garbage_every_prompt: int = 0
    api_key: str | None = None  # when set, a request without `Authorization: Bearer <key>` gets 401
    requests: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)  # the distinct prompts judged, in the order first asked
    unauthorized: int = 0
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> JudgeStandIn:
        standin = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if standin.api_key and self.headers.get("Authorization") != f"Bearer {standin.api_key}":
                    with lock:
                        standin.unauthorized += 1
                    self._send(401, {"error": {"message": "bad key"}})
                    return
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": standin.model_id, "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if standin.api_key and self.headers.get("Authorization") != f"Bearer {standin.api_key}":
                    with lock:
                        standin.unauthorized += 1
                    self._send(401, {"error": {"message": "bad key"}})
                    return
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": "not found"})
                    return
                prompt = json.dumps(body.get("messages") or [], sort_keys=True)
                with lock:
                    standin.requests.append(body)
                    n = len(standin.requests)
                    if prompt not in standin.prompts:
                        standin.prompts.append(prompt)
                    nth = standin.prompts.index(prompt) + 1
                garbage = (standin.garbage_every and n % standin.garbage_every == 0) or (
                    standin.garbage_every_prompt and nth % standin.garbage_every_prompt == 0
                )
                text = "I cannot decide." if garbage else f"The answer is fine. Rating: [[{standin.rating}]]"
                self._send(
                    200,
                    {
                        "id": f"judge-{n}",
                        "object": "chat.completion",
                        "model": standin.model_id,
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    },
                )

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
