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
def receiving(host: str = "127.0.0.1") -> Iterator[tuple[str, list[Received]]]:
    """Yields the server's base URL and the list every POST is appended to."""
    received: list[Received] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(Received(time.monotonic(), self.path, json.loads(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}", received
    finally:
        server.shutdown()
