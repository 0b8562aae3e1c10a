"""A loopback HTTP listener that records every request it gets: the witness that no request
reaches a host the gateway does not allow."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator


class Recorder:
    def __init__(self, port: int) -> None:
        self.port = port
        self.requests: list[str] = []

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def http_listener() -> Iterator[Recorder]:
    """Answers every request with 404 (and a TCP connection counts as a request too)."""
    recorder = Recorder(0)

    class Handler(http.server.BaseHTTPRequestHandler):
        def _any(self) -> None:
            recorder.requests.append(f"{self.command} {self.path}")
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _any

        def log_message(self, *args: object) -> None:
            return None

    class Server(http.server.ThreadingHTTPServer):
        def verify_request(self, request: object, client_address: object) -> bool:
            recorder.requests.append("connect")
            return True

    server = Server(("127.0.0.1", 0), Handler)
    recorder.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
