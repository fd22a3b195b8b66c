"""The agent's health endpoint, on its own port and its own thread.

A handler that holds the CPU or blocks the event loop must not make a live agent look dead, so
the health check never shares the loop with handlers: a small threaded HTTP server answers it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class HealthServer:
    """Serves ``GET {path}`` → ``200 {"status": "ok", "agent": id}``, and ``GET /metrics``."""

    def __init__(
        self, agent_id: str, host: str, port: int, path: str, metrics: Callable[[], bytes] | None = None
    ) -> None:
        body = json.dumps({"status": "ok", "agent": agent_id}).encode()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                wanted = self.path.split("?", 1)[0]
                if wanted == path:
                    self._answer(200, body)
                elif wanted == "/metrics" and metrics is not None:
                    self._answer(200, metrics(), "text/plain; version=0.0.4; charset=utf-8")
                else:
                    self._answer(404, b'{"error": {"code": "NOT_FOUND", "message": "no such path"}}')

            def _answer(self, status: int, payload: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return  # probes every few seconds would drown the agent's own log

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                return  # a prober that hung up (its timeout) is not the agent's problem

        self._server = Server((host, port), Handler)
        self._server.daemon_threads = True
        # shutdown() waits for the serving loop's next poll: a tenth of a second rather than the
        # default half keeps a stopping agent within its 2 s.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.1,), name="reach-health", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
