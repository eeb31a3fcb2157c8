"""The run page over HTTP: the standard library's threading server, one render per request.

    server = DashboardServer(watcher.board, host="127.0.0.1", port=0)
    url = server.start()        # serves in a background thread
    server.stop()

Routes: `/` (the page; `?miner=<64 hex>` adds that miner's history) and `/board.json` (the same
board as JSON, for scripts). It only reads the board, so a slow or hostile client costs a thread
for at most `TIMEOUT_SECONDS`; it binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from node.roles.dashboard.board import RunBoard
from node.roles.dashboard.render import page

log = logging.getLogger(__name__)
TIMEOUT_SECONDS = 10.0


class DashboardServer:
    def __init__(self, board: Callable[[], RunBoard], host: str = "127.0.0.1", port: int = 0, refresh: float = 3.0):
        self.board, self.refresh = board, refresh
        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.dashboard = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="dashboard-http", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/"

    def start(self) -> str:
        self.thread.start()
        return self.url

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(TIMEOUT_SECONDS)


class _Handler(BaseHTTPRequestHandler):
    timeout = TIMEOUT_SECONDS
    server_version = "pulse-dashboard"

    def do_GET(self) -> None:
        dashboard: DashboardServer = self.server.dashboard  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        if url.path == "/":
            miner = parse_qs(url.query).get("miner", [None])[0]
            body = page(dashboard.board(), miner.strip().lower() if miner else None, dashboard.refresh)
            self._send(200, "text/html; charset=utf-8", body.encode())
        elif url.path == "/board.json":
            self._send(200, "application/json", json.dumps(board_json(dashboard.board())).encode())
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


def board_json(board: RunBoard) -> dict[str, Any]:
    """The board as JSON-able data (the per-miner outcome lists left out: `?miner=` has them)."""
    data = dataclasses.asdict(board)
    data.pop("outcomes")
    data["run"]["validators"] = sorted(board.run.validators)
    data["online"] = board.online()
    return data
