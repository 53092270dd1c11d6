"""A local HTTP server that records the JSON POSTed to it: the far end of webhooks in tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    at: float  # time.monotonic()
    path: str
    body: Any


@contextmanager
def receiving(
    host: str = "127.0.0.1", failing: frozenset[str] = frozenset()
) -> Iterator[tuple[str, list[Received]]]:
    """Yields the server's base URL and the list every request is appended to (its method is
    in `body["method"]` when it carries no JSON). Paths in `failing` answer 503."""
    received: list[Received] = []

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else {"method": self.command}
            received.append(Received(time.monotonic(), self.path, body))
            self.send_response(503 if self.path.split("?")[0] in failing else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_PUT = do_GET = do_DELETE = answer

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}", received
    finally:
        server.shutdown()
